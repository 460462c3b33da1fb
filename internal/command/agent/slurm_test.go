package agent

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSlurmFlagErrors: --executor and the --slurm-* flags are checked
// before anything reaches Slurm or the broker, naming the flag and the fix.
func TestSlurmFlagErrors(t *testing.T) {
	t.Parallel()
	base := []string{"--broker-url", "http://127.0.0.1:1", "--broker-token", "x", "--region", "r"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown executor", []string{"--executor", "pbs"}, `--executor "pbs": unknown executor: use one of local, slurm`},
		{"no shared dir", []string{"--executor", "slurm"}, `--slurm-shared-dir: give an absolute directory every compute node sees`},
		{"relative shared dir", []string{"--executor", "slurm", "--slurm-shared-dir", "scratch"}, `--slurm-shared-dir "scratch": give an absolute directory`},
		{"missing shared dir", []string{"--executor", "slurm", "--slurm-shared-dir", "/nonexistent/gpupass"}, `--slurm-shared-dir "/nonexistent/gpupass": not a directory here`},
		{"bad per-node profile", []string{"--executor", "slurm", "--slurm-shared-dir", "/tmp", "--slurm-simulate", "n1"}, `--slurm-simulate "n1": want NODE=PROFILE`},
		{"ledger in the shared dir", []string{"--executor", "slurm", "--slurm-shared-dir", "/tmp", "--slurm-ledger-dir", "/tmp/gpupass-ledger"}, `--slurm-ledger-dir "/tmp/gpupass-ledger" is inside --slurm-shared-dir, which every job can write`},
		// Named as the user typed it, not as the ledger's default
		// under it: the node's keys must move too.
		{"state dir in the shared dir", []string{"--executor", "slurm", "--slurm-shared-dir", "/tmp", "--state-dir", "/tmp/gpupass-agent"}, `--state-dir "/tmp/gpupass-agent" is inside --slurm-shared-dir, which every job can write`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errw bytes.Buffer
			code := Main(context.Background(), append(append(base, "--state-dir", t.TempDir()), tt.args...), &out, &errw)
			if code == 0 || !strings.Contains(errw.String(), tt.want) {
				t.Errorf("exit %d stderr %q, want an error with %q", code, errw.String(), tt.want)
			}
		})
	}
}
