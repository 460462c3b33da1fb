package testutil_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// ProcessTempDir removes the directories of test processes that are gone
// and keeps those of processes still running, its own included.
func TestProcessTempDir(t *testing.T) {
	prefix := fmt.Sprintf("gpupass-ptd-%d-", rand.Uint32())
	t.Cleanup(func() {
		m, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
		for _, d := range m {
			os.RemoveAll(d)
		}
	})
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	running := exec.Command("sleep", "30")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { running.Process.Kill(); running.Wait() }()
	mk := func(name string) string {
		d := filepath.Join(os.TempDir(), prefix+name)
		if err := os.MkdirAll(filepath.Join(d, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	deadDir := mk(fmt.Sprintf("%d-a", gone.Process.Pid))
	liveDir := mk(fmt.Sprintf("%d-b", running.Process.Pid))
	ownDir := mk(fmt.Sprintf("%d-c", os.Getpid()))
	oddDir := mk("12345") // not PREFIX<pid>-<random>: not ours to judge

	dir, err := testutil.ProcessTempDir(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(dir), fmt.Sprintf("%s%d-", prefix, os.Getpid())) {
		t.Errorf("made %s, want a name starting with %s%d-", dir, prefix, os.Getpid())
	}
	if _, err := os.Stat(deadDir); !os.IsNotExist(err) {
		t.Errorf("the directory of a finished process is still there (%v)", err)
	}
	for _, d := range []string{liveDir, ownDir, oddDir, dir} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
}
