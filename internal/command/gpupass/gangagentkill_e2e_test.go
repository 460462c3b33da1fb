//go:build e2e

package gpupass_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestGangAgentKilled (issue #34, "a lost node … the restart
// (--resume-elsewhere) starts a fresh gang from the last checkpoint …
// nothing is lost or duplicated across a kill -9 of an agent of the
// gang"): three local agents that take gang ranks, a gang of two trained
// with --resume-elsewhere --max-restarts 1, and rank 1's agent killed -9
// mid-run and never brought back. The killed agent's run dies with it
// (its cgroup), and rank 0 fails at once (gloo loses its peer), well
// before the broker finds the node lost: without a restart left the run
// fails there ("exited with status 1", which this test saw without
// --max-restarts). With one, the gang waits until the lost rank has ended
// (its node found lost), starts again away from the dead node from rank
// 0's last shipped checkpoint, and succeeds; each rank's log is one
// gap-free, unrepeated sequence across both attempts.
func TestGangAgentKilled(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const region = "gang-faults"
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	rc := stack.Runs(t)
	// Job ports apart from up's own agents' (29500 on).
	agents := map[string]*upstack.Agent{}
	for i, name := range []string{"gang-a", "gang-b", "gang-c"} {
		lo := 31000 + 100*i
		agents[name] = stack.StartAgent(t, name, region, "--job-address", "127.0.0.1",
			"--job-ports", strconv.Itoa(lo)+"-"+strconv.Itoa(lo+99), "--price-per-hour", strconv.FormatFloat(2.4+0.1*float64(i), 'f', 1, 64))
	}
	cfg := stack.Config(t)
	nc, err := client.Dial(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	f := &faultStack{t: t, ctx: ctx, stack: stack, rc: rc, nc: nc}
	nodeAgent := map[string]*upstack.Agent{}
	for name, a := range agents {
		nodeAgent[f.nodeID(name)] = a
	}
	stack.WaitGang(t, ctx, "examples/ddp/gpupass.yaml", region, 2)

	const total = 200
	if b, err := stack.Command(ctx, "train", "--spec", "examples/ddp/gpupass.yaml", "--region", region, "--workdir", "examples/ddp",
		"--name", "lost", "--resume-elsewhere", "--max-restarts", "1", "--", py, "train_ddp.py", "--timeout", "60",
		"--steps", strconv.Itoa(total), "--step-sleep", "0.05").CombinedOutput(); err != nil {
		t.Fatalf("train: %v\n%s", err, b)
	}
	run := upstack.WaitRun(t, ctx, rc, "lost", "rank 0 past step 60", func(r *gpupassv1.Run) bool {
		return upstack.StepAtLeast(ctx, rc, r.Id, 60)
	})
	rank1 := upstack.GetRun(t, ctx, rc, run.Id+"-r1")
	victim := nodeAgent[rank1.NodeId]
	if victim == nil {
		t.Fatalf("rank 1 is on %s, none of this test's agents", rank1.NodeId)
	}
	dead := rank1.NodeId
	victim.Kill9(t)
	t.Logf("killed -9 %s (%s), rank 1's node, at step ≥ 60", victim.Name, dead)

	run = upstack.WaitEnd(t, ctx, rc, run.Id)
	rank1 = upstack.GetRun(t, ctx, rc, run.Id+"-r1")
	t.Logf("run %s on %s, rank 1 %s on %s, replaced %v: %s", run.State, run.NodeId, rank1.State, rank1.NodeId, run.ReplacedNodes, run.Reason)
	if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || rank1.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
		t.Fatalf("run %s (%s), rank 1 %s (%s): want both succeeded on a fresh gang", run.State, run.Reason, rank1.State, rank1.Reason)
	}
	if run.NodeId == dead || rank1.NodeId == dead {
		t.Errorf("the restarted gang is on %s and %s, the dead node %s among them", run.NodeId, rank1.NodeId, dead)
	}
	if !slices.Contains(append(run.ReplacedNodes, rank1.ReplacedNodes...), dead) {
		t.Logf("replaced nodes of rank 0 %v, rank 1 %v (the dead node %s not listed)", run.ReplacedNodes, rank1.ReplacedNodes, dead)
	}
	// CheckLog fails on a record lost or repeated; the broker holds all.
	for rank, id := range []string{run.Id, rank1.Id} {
		if l := upstack.CheckLog(t, ctx, rc, id); !strings.Contains(l, `"msg":"rank `+strconv.Itoa(rank)+` resumed from`) {
			t.Errorf("rank %d's log does not show it resumed from the checkpoint:\n%s", rank, upstack.Tail(l, 3000))
		}
	}
	if steps, _ := upstack.Loss(t, ctx, rc, run.Id); len(steps) != total {
		t.Errorf("the restarted gang's metrics hold %d of %d steps", len(steps), total)
	}
}
