package bundle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// TestOptionErrorsNameFields checks that bad options are *fielderr.Error
// naming the Options field, so the CLI and `ci step` can each name their
// own flag or input.
func TestOptionErrorsNameFields(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	noPython := filepath.Join(dir, "gpupass.yaml")
	if err := os.WriteFile(noPython, []byte("name: x\nruntime:\n  packages: [\"alpha==1.0\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		run       func() error
		wantField string
	}{
		{"push without a wheelhouse", func() error { _, err := Push(context.Background(), PushOptions{Ref: "r/x:1"}); return err }, "Wheelhouse"},
		{"pull without a directory", func() error { _, err := Pull(context.Background(), PullOptions{Ref: "r/x:1"}); return err }, "To"},
		{"spec without python", func() error {
			s, err := Target{Spec: noPython}.load()
			if err != nil {
				return err
			}
			_, err = Target{Spec: noPython}.wheelTarget(s)
			return err
		}, "Python"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.run()
			var ie *fielderr.Error
			if !errors.As(err, &ie) || ie.Field != tc.wantField {
				t.Fatalf("err %v, want an input error for %s", err, tc.wantField)
			}
		})
	}
}
