package localstack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLastError: a child that exits during start-up is reported with the
// error line it wrote last (an agent refusing an executor's flag that up
// handed it), made safe for a terminal; a log without one adds nothing.
func TestLastError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct{ log, want string }{
		{"time=… level=INFO msg=starting\ngpupass-agent: --kube-image is required\n", ": gpupass-agent: --kube-image is required"},
		{"gpupass-agent: first\nlevel=INFO\ngpupass-agent: --slurm-shared-dir \"x\": not a directory here\n", `: gpupass-agent: --slurm-shared-dir "x": not a directory here`},
		{strings.Repeat("noise\n", 5000) + "gpupass-broker: listen tcp: address in use\n", ": gpupass-broker: listen tcp: address in use"},
		{"gpupass-agent: a value \x1b]0;owned\a here\n", `: gpupass-agent: a value \x1b]0;owned\x07 here`},
		{"level=INFO msg=bye\n", ""},
	} {
		p := filepath.Join(dir, "agent.log")
		if err := os.WriteFile(p, []byte(tt.log), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := lastError(p); got != tt.want {
			t.Errorf("lastError(%.40q…) = %q, want %q", tt.log, got, tt.want)
		}
	}
	if got := lastError(filepath.Join(dir, "missing.log")); got != "" {
		t.Errorf("lastError of a missing log = %q", got)
	}
}
