package testutil_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TreeCPU counts what a grandchild burns while it runs and after it has
// ended and been waited for, and nothing of processes outside the tree.
func TestTreeCPU(t *testing.T) {
	// sh (child) runs a busy sh (grandchild), then says its PID and
	// waits: the grandchild's CPU must show under this test's process
	// while the child is alive and after it has been waited for.
	done := t.TempDir() + "/done"
	child := exec.Command("sh", "-c", `sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; : >"$1"; sleep 30`, "sh", done)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	self := os.Getpid()
	before, err := testutil.TreeCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(done); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the busy grandchild did not end within a minute")
		}
	}
	own, err := testutil.TreeCPU(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	alive, err := testutil.TreeCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	// The busy loop takes a few hundred ms of CPU on any machine this runs
	// on; 50 ms is far above what the idle sh and the test's polling use.
	if own < 50*time.Millisecond {
		t.Errorf("the child's tree used %v, want the grandchild's busy loop (50 ms or more)", own)
	}
	if alive-before < own-10*time.Millisecond {
		t.Errorf("this process's tree grew by %v while the child (%v) was alive, want at least the child's", alive-before, own)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	after, err := testutil.TreeCPU(self)
	if err != nil {
		t.Fatal(err)
	}
	if after < alive-10*time.Millisecond {
		t.Errorf("after the child was waited for, this tree's CPU fell from %v to %v: its time must move to cutime", alive, after)
	}
	if _, err := testutil.TreeCPU(1 << 30); err == nil || !strings.Contains(err.Error(), strconv.Itoa(1<<30)) {
		t.Errorf("a PID that does not exist: %v, want an error naming it", err)
	}
}
