package executor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/testutil"
)

func TestMain(m *testing.M) {
	// Re-executed as an "agent" that runs a long job until killed.
	if pidFile := os.Getenv("GPUPASS_EXECUTOR_HELPER_PIDFILE"); pidFile != "" {
		local.ProcessRunner{}.Run(context.Background(), executor.Attempt{
			Command: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 300"},
		}, func(executor.Line) {})
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestAgentKilledTakesTheJobDown: kill -9 of the agent must not leave its
// job training unsupervised.
func TestAgentKilledTakesTheJobDown(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "job.pid")
	agent := exec.Command(os.Args[0], "-test.run=^$")
	agent.Env = append(os.Environ(), "GPUPASS_EXECUTOR_HELPER_PIDFILE="+pidFile)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	job := readPid(t, pidFile)
	if !testutil.PIDAlive(job) {
		t.Fatal("job did not start")
	}
	agent.Process.Signal(syscall.SIGKILL)
	agent.Wait()
	waitGone(t, job)
}
