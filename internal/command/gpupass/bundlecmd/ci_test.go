package bundlecmd_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/bundlecmd"
)

// TestBundleStepErrorsNameInputs: a bundle use case's error reaches a
// `ci step` user with the input's name, never a CLI flag the step has no
// way to set, and the CLI user with the flag; a step missing inputs
// names all of them at once.
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
		ci       gpupass.CIStepOptions
		cli      []string // nil: no CLI counterpart
		wantCode int
		want     string // in the ci step's error
		wantCLI  string // in the CLI's stderr
		flag     string // must not be in the ci step's error
	}{
		{"push, incomplete", gpupass.CIStepOptions{Command: "bundle-push", RegistryRef: "127.0.0.1:1/x:1", Wheelhouse: house, Spec: spec},
			[]string{"bundle", "push", "--plain-http", "--no-cache", "-w", house, "--spec", spec, "127.0.0.1:1/x:1"},
			gpupass.ExitFindings, "does not cover spec", "(--allow-incomplete pushes anyway)", "--allow-incomplete"},
		{"push without inputs", gpupass.CIStepOptions{Command: "bundle-push"}, nil,
			gpupass.ExitUsage, "missing required input registry-ref, wheelhouse", "", "--"},
		{"pull without inputs", gpupass.CIStepOptions{Command: "bundle-pull", RegistryRef: "127.0.0.1:1/x:1"}, nil,
			gpupass.ExitUsage, "missing required input wheelhouse", "", "--"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.ci.Getenv = func(string) string { return "" }
			tc.ci.Global = &gpupass.GlobalOptions{Output: "text", Bundle: bundlecmd.Plugin{}}
			err := gpupass.RunCIStep(context.Background(), &tc.ci, &bytes.Buffer{})
			if gpupass.ExitCode(err) != tc.wantCode || !strings.Contains(fmt.Sprint(err), tc.want) || strings.Contains(fmt.Sprint(err), tc.flag) {
				t.Errorf("ci step: %v (exit %d); want exit %d, %q and no %s", err, gpupass.ExitCode(err), tc.wantCode, tc.want, tc.flag)
			}
			if tc.cli == nil {
				return
			}
			code, _, stderr := runCLI(t, tc.cli...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.wantCLI) {
				t.Errorf("CLI: exit %d, stderr %q; want exit %d and %q", code, stderr, tc.wantCode, tc.wantCLI)
			}
		})
	}
}
