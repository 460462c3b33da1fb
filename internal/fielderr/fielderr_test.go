package fielderr_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/gpupass/gpupass/internal/fielderr"
)

func TestApply(t *testing.T) {
	t.Parallel()
	cli := fielderr.Names{"tolerance": "--tolerance", "registry username": "--registry-username", "registry password": "--registry-password"}
	ci := fielderr.Names{"tolerance": "input tolerance"}
	tol := fielderr.New("tolerance", "x%", "not a number; use e.g. 5%%")
	pair := &fielderr.Error{Field: "registry username", Problem: "goes with {registry password}: give both or neither"}
	cause := fielderr.New("job user", "bob", "looking it up: %w", fs.ErrNotExist)
	tests := []struct {
		name     string
		err      error
		names    fielderr.Names
		want     string
		wantLib  string
		wantWrap error
	}{
		{name: "cli flag", err: tol, names: cli, want: `--tolerance "x%": not a number; use e.g. 5%`, wantLib: `tolerance "x%": not a number; use e.g. 5%`},
		{name: "ci input", err: tol, names: ci, want: `input tolerance "x%": not a number; use e.g. 5%`},
		{name: "wrapped keeps context", err: fmt.Errorf("comparing runs: %w", tol), names: cli, want: `comparing runs: --tolerance "x%": not a number; use e.g. 5%`},
		{name: "field named in the problem", err: pair, names: cli, want: "--registry-username: goes with --registry-password: give both or neither", wantLib: "registry username: goes with registry password: give both or neither"},
		{name: "unmapped field stays", err: cause, names: cli, want: `job user "bob": looking it up: file does not exist`, wantWrap: fs.ErrNotExist},
		{name: "innermost table wins", err: ci.Apply(fmt.Errorf("step: %w", tol)), names: cli, want: `step: input tolerance "x%": not a number; use e.g. 5%`},
		{name: "sentence goes on", err: &fielderr.Error{Field: "region", Problem: "is required"}, names: fielderr.Names{"region": "--region"}, want: "--region is required"},
		{name: "other errors untouched", err: errors.New("--x"), names: cli, want: "--x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.wantLib != "" && tt.err.Error() != tt.wantLib {
				t.Errorf("library text %q, want %q", tt.err.Error(), tt.wantLib)
			}
			got := tt.names.Apply(tt.err)
			if got.Error() != tt.want {
				t.Errorf("Apply: %q, want %q", got.Error(), tt.want)
			}
			var fe *fielderr.Error
			if tt.err != error(nil) && errors.As(tt.err, &fe) && !errors.As(got, &fe) {
				t.Error("the renamed error lost the *fielderr.Error in its chain")
			}
			if tt.wantWrap != nil && !errors.Is(got, tt.wantWrap) {
				t.Errorf("errors.Is(%v) false after Apply", tt.wantWrap)
			}
		})
	}
}
