package bundlecmd_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/command/gpupass"
)

// TestBundleStepErrorsNameInputs: a bundle use case's error reaches a
// pipeline step (the real command with -o github) with the flag, its
// variable and the input, and the CLI user with the flag; a step missing
// inputs names all of them at once.
func TestBundleStepErrorsNameInputs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A wheelhouse that does not cover the spec: the coverage check fails
	// before any registry is contacted.
	house := filepath.Join(dir, "wheels")
	if err := os.MkdirAll(house, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(house, "alpha-1.0-py3-none-any.whl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "gpupass.yaml")
	if err := os.WriteFile(spec, []byte("name: x\nruntime:\n  python: \"3.11\"\n  packages: [\"beta==1.0\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		ci       []string // the step: -o github and the inputs as flags
		cli      []string // nil: no CLI counterpart
		wantCode int
		want     string // in the step's stderr
		wantCLI  string // in the CLI's stderr
	}{
		{"push, incomplete", []string{"-o", "github", "bundle", "push", "--ref", "127.0.0.1:1/x:1", "--wheelhouse", house, "--spec", spec, "--no-cache"},
			[]string{"bundle", "push", "--plain-http", "--no-cache", "-w", house, "--spec", spec, "127.0.0.1:1/x:1"},
			gpupass.ExitFindings, "does not cover spec", "(--allow-incomplete pushes anyway)"},
		{"push without inputs", []string{"-o", "github", "bundle", "push"}, nil,
			gpupass.ExitUsage, "bundle push: missing --ref (GPUPASS_REF, the registry-ref input), --wheelhouse (GPUPASS_WHEELHOUSE, the wheelhouse input)", ""},
		{"pull without inputs", []string{"-o", "github", "bundle", "pull", "--ref", "127.0.0.1:1/x:1"}, nil,
			gpupass.ExitUsage, "bundle pull: missing --to (GPUPASS_TO, the wheelhouse input)", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runCLI(t, tc.ci...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.want) {
				t.Errorf("gpupass %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.ci, " "), code, stderr, tc.wantCode, tc.want)
			}
			if tc.cli == nil {
				return
			}
			code, _, stderr = runCLI(t, tc.cli...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.wantCLI) {
				t.Errorf("CLI: exit %d, stderr %q; want exit %d and %q", code, stderr, tc.wantCode, tc.wantCLI)
			}
		})
	}
}
