package executor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
)

// stopWhenReady runs script under sh -c and cancels it once it has
// printed "ready".
func stopWhenReady(t *testing.T, script string, grace time.Duration) executor.Exit {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	return local.ProcessRunner{}.Run(ctx, executor.Attempt{Command: []string{"sh", "-c", script}, Grace: grace},
		func(l executor.Line) {
			if l.Text == "ready" {
				once.Do(cancel)
			}
		})
}

// TestGraceReachesChildren: the leader is a wrapper that dies at SIGTERM;
// its child, which saves a checkpoint on SIGTERM, gets the grace period
// rather than an immediate SIGKILL.
func TestGraceReachesChildren(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "saved")
	// The child says ready only once its trap is set; the wrapper's wait
	// ends at SIGTERM, so the wrapper exits at once.
	script := fmt.Sprintf(`(trap 'sleep 0.2; echo ok > %s; exit 0' TERM; echo ready; while :; do sleep 0.05; done) & wait`, marker)
	ex := stopWhenReady(t, script, time.Minute)
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the child was killed inside the grace period (%+v): %v", ex, err)
	}
	if !ex.Stopped || ex.Killed {
		t.Errorf("exit %+v, want stopped and not killed", ex)
	}
}

// TestGraceEndsForChildren: a child that ignores SIGTERM after its
// wrapper died is killed when the grace period ends, and the exit says
// SIGKILL was needed.
func TestGraceEndsForChildren(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	script := fmt.Sprintf(`sh -c 'trap "" TERM; echo $$ > %s; echo ready; exec sleep 300' & wait`, pidFile)
	ex := stopWhenReady(t, script, 200*time.Millisecond)
	if !ex.Stopped || !ex.Killed {
		t.Errorf("exit %+v, want stopped and killed", ex)
	}
	waitGone(t, readPid(t, pidFile))
}
