package slurm_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor/slurm"
)

// TestToolTimeoutTerminates: a Slurm tool past its timeout gets SIGTERM,
// and time to act on it, not SIGKILL. An srun killed outright while its
// step launches leaves its allocation held (for good with InactiveLimit=0,
// Slurm's default): CI saw such a check step hold a node for 20 minutes
// while the runs meant for it waited. The srun here is a script on PATH
// that records the SIGTERM it gets.
func TestToolTimeoutTerminates(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "terminated")
	script := "#!/bin/sh\nsleep 30 &\ntrap 'kill $!; echo released >" + mark + "; exit 143' TERM\nwait\n"
	if err := os.WriteFile(filepath.Join(dir, "srun"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	c := &slurm.Client{Timeout: 500 * time.Millisecond}
	_, err := c.Step(context.Background(), "n1", "", "", nil, "true")
	if err == nil {
		t.Fatal("a step past its timeout succeeded")
	}
	if _, serr := os.Stat(mark); serr != nil {
		t.Fatalf("srun got no SIGTERM to give its allocation back (killed outright): %v", err)
	}
}
