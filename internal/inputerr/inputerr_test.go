package inputerr

import (
	"errors"
	"fmt"
	"testing"
)

func TestRename(t *testing.T) {
	t.Parallel()
	plain := errors.New("disk full")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"renamed", New("Prices", "us=x", "no run named %q", "us"), `--price "us=x": no run named "us"`},
		{"no value", New("Runs", "", "nothing to compare"), "--label: nothing to compare"},
		{"missing", Missing("Prices", "the price per hour"), "--price is required: the price per hour"},
		{"field not in map", New("Metric", "x", "unknown"), `Metric "x": unknown`},
		{"not an input error", plain, "disk full"},
		{"wrapped keeps the input error", fmt.Errorf("ctx: %w", New("Runs", "a", "b")), `--label "a": b`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Rename(tc.err, map[string]string{"Prices": "--price", "Runs": "--label"})
			if got.Error() != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
