//go:build e2e

package kubernetes_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// gangDiag says where a Kubernetes gang stands when a test waiting on it
// gives up: the gang's pods and Jobs, why those not running wait (their
// description and the namespace's events), who holds the node's GPUs
// (every pod of the cluster that has not ended, whoever made it: the
// cluster is shared), each rank's state and reason at the broker, and the
// agents' log lines that name the run. A wait on a gang fails with all
// of it, at once when the run ended first (nothing it waits for can come
// then), rather than after the test's whole time with one line.
type gangDiag struct {
	c     *k8stest.Cluster
	ns    string
	rc    *client.RunClients
	stack *upstack.Stack
}

// wait polls cond until it holds, and fails the test with the state of
// run's gang (rank 0's allocation id; "" for every gpupass pod of the
// namespace) when ctx ends.
func (d *gangDiag) wait(t *testing.T, ctx context.Context, what, run string, cond func() bool) {
	t.Helper()
	d.poll(t, ctx, what, run, false, cond)
}

// whileRuns is wait that also fails, at once, when the run has ended:
// what it waits for can no longer come.
func (d *gangDiag) whileRuns(t *testing.T, ctx context.Context, what, run string, cond func() bool) {
	t.Helper()
	d.poll(t, ctx, what, run, true, cond)
}

func (d *gangDiag) poll(t *testing.T, ctx context.Context, what, run string, failEnded bool, cond func() bool) {
	t.Helper()
	for !cond() {
		if failEnded {
			if r, err := d.rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: run})); err == nil && ended(r.Msg.Run) {
				if cond() {
					return
				}
				t.Fatalf("run %s ended (%s: %s) before %s\n%s", run, r.Msg.Run.State, r.Msg.Run.Reason, what, d.dump(run))
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s\n%s", what, d.dump(run))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func ended(r *gpupassv1.Run) bool {
	switch r.State {
	case gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, gpupassv1.AllocState_ALLOC_STATE_FAILED, gpupassv1.AllocState_ALLOC_STATE_CANCELLED:
		return true
	}
	return false
}

// dump is the gang's state as a test's failure shows it; run may be ""
// (not known yet): the namespace's and cluster's side only. It runs on a
// context of its own, as the test's may be the one that ran out.
func (d *gangDiag) dump(run string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var b strings.Builder
	kubectl := func(title string, args ...string) string {
		out, err := d.c.KubectlCmd(ctx, args...).CombinedOutput()
		fmt.Fprintf(&b, "--- %s (kubectl %s)\n%s", title, strings.Join(args, " "), upstack.Tail(string(out), 6000))
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
		return string(out)
	}
	sel := "app.kubernetes.io/managed-by=gpupass-agent"
	if run != "" {
		sel = "gpupass.dev/gang=" + run
	}
	kubectl("the gang's pods and Jobs", "-n", d.ns, "get", "pods,jobs", "-l", sel, "-o", "wide")
	// Every Job and pod the agents made here: the runtime-init and
	// suite check Jobs carry no gang label, and hold GPUs too.
	kubectl("every gpupass Job and pod in the namespace", "-n", d.ns, "get", "pods,jobs", "-l", "app.kubernetes.io/managed-by=gpupass-agent", "-o", "wide", "--show-labels")
	waiting := kubectl("the gang's pods not running", "-n", d.ns, "get", "pods", "-l", sel,
		"-o", `jsonpath={range .items[?(@.status.phase=="Pending")]}{.metadata.name}{"\n"}{end}`)
	for _, p := range strings.Fields(waiting) {
		kubectl("pod "+p, "-n", d.ns, "describe", "pod", p)
	}
	kubectl("the namespace's events", "-n", d.ns, "get", "events", "--sort-by=.lastTimestamp")
	kubectl("who holds GPUs: every pod of the cluster not ended", "get", "pods", "-A", "--field-selector=status.phase!=Succeeded,status.phase!=Failed",
		"-o", `custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,PHASE:.status.phase,GPUS:.spec.containers[*].resources.requests.nvidia\.com/gpu,NODE:.spec.nodeName,DELETING:.metadata.deletionTimestamp`)
	kubectl("the node's allocated resources", "describe", "nodes")
	if run != "" {
		for r := 0; r < 4; r++ {
			id := run
			if r > 0 {
				id = fmt.Sprintf("%s-r%d", run, r)
			}
			resp, err := d.rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
			if err != nil {
				if r == 0 {
					fmt.Fprintf(&b, "--- rank 0 (%s): %v\n", id, err)
				}
				break
			}
			x := resp.Msg.Run
			fmt.Fprintf(&b, "--- rank %d (%s): %s on %s, %d restart(s), held through seq %d: %s\n", r, id, x.State, x.NodeId, x.Restarts, x.HeldThrough, x.Reason)
		}
	}
	if out, err := d.stack.Command(ctx, "runs", "--ranks").CombinedOutput(); err == nil || len(out) > 0 {
		fmt.Fprintf(&b, "--- gpupass runs --ranks\n%s", upstack.Tail(string(out), 3000))
	}
	// The agents' lines about the run (all of their tails are logged
	// when the test ends).
	logs, _ := filepath.Glob(filepath.Join(d.stack.State, "logs", "*.log"))
	for _, f := range logs {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var keep []string
		for _, l := range strings.Split(string(raw), "\n") {
			if run == "" || strings.Contains(l, run) {
				keep = append(keep, l)
			}
		}
		fmt.Fprintf(&b, "--- %s: lines naming the run\n%s\n", filepath.Base(f), upstack.Tail(strings.Join(keep, "\n"), 4000))
	}
	return b.String()
}
