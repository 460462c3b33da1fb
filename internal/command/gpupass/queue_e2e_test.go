//go:build e2e

package gpupass_test

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2EQueueTimeout (issue #35): one node under a real `gpupass up`,
// two detached trains. The first runs; the second waits in the queue:
// `gpupass runs` shows it at position 1 (QUEUE column and JSON), `gpupass
// logs` says where it stands, and after --queue-timeout 3s it fails with
// the reason, which `gpupass wait` prints and exits 1 on.
func TestE2EQueueTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	submit := func(name string, extra ...string) runview.Run {
		t.Helper()
		args := append([]string{"-o", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--name", name, "--detach"}, extra...)
		out, err := stack.Command(ctx, append(args, "--", "sh", "-c", "echo started; exec sleep 600")...).Output()
		var l runview.List
		if err != nil || json.Unmarshal(out, &l) != nil || len(l.Runs) != 1 {
			t.Fatalf("train %s --detach: %v\n%s", name, err, out)
		}
		return l.Runs[0]
	}
	first := submit("first")
	t.Cleanup(func() { _ = stack.Command(context.Background(), "cancel", first.ID).Run() })
	second := submit("second", "--queue-timeout", "3s")
	if second.State != "pending" || second.QueuePosition != 1 || second.QueueTimeoutSeconds != 3 {
		t.Fatalf("second train printed %s at queue position %d with queue timeout %ds; want pending at 1, 3s (first: %s on %q)",
			second.State, second.QueuePosition, second.QueueTimeoutSeconds, first.State, first.NodeID)
	}
	runs, err := stack.Command(ctx, "runs").CombinedOutput()
	if err != nil {
		t.Fatalf("gpupass runs: %v\n%s", err, runs)
	}
	if !regexp.MustCompile(`(?m)^` + second.ID + ` +second-us-west-2 +us-west-2 +pending +1 `).Match(runs) {
		t.Errorf("gpupass runs does not show %s pending at queue position 1:\n%s", second.ID, runs)
	}
	var logsErr strings.Builder
	logs := stack.Command(ctx, "logs", second.ID)
	logs.Stderr = &logsErr
	if err := logs.Run(); err != nil {
		t.Fatalf("gpupass logs %s: %v\n%s", second.ID, err, logsErr.String())
	}
	if !strings.Contains(logsErr.String(), second.ID+" waiting in the queue of us-west-2 at position 1 for 1 busy certified node") {
		t.Errorf("gpupass logs does not say where %s stands:\n%s", second.ID, logsErr.String())
	}

	out, err := stack.Command(ctx, "wait", second.ID).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("gpupass wait %s: %v, want exit 1 (the run failed)\n%s", second.ID, err, out)
	}
	const why = "waited 3s in the queue at position 1 for 1 busy certified node in us-west-2: raise --queue-timeout or add nodes"
	if !strings.Contains(string(out), why) {
		t.Errorf("gpupass wait does not give the reason %q:\n%s", why, out)
	}
	runs, err = stack.Command(ctx, "runs").CombinedOutput()
	if err != nil || !regexp.MustCompile(second.ID+` .* failed +- .*`+regexp.QuoteMeta(why)).Match(runs) {
		t.Errorf("gpupass runs does not show %s failed with the reason: %v\n%s", second.ID, err, runs)
	}
}
