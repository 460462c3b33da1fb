package upstack

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	brokerclient "github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/metrics"
)

// This file holds what the end-to-end tests of gangs (resources.nodes
// > 1, issue #34) on every executor share: reading runs and ranks, the
// one-process loss curve a gang must match, and waiting for states. A
// gang's rank r > 0 is the run ID+"-r<r>".

// Runs dials the stack's broker for its run services with the stack's
// token.
func (s *Stack) Runs(t testing.TB) *brokerclient.RunClients {
	t.Helper()
	cfg := s.Config(t)
	rc, err := brokerclient.DialRuns(cfg.BrokerURL, brokerclient.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// GetRun is the run (or rank) id as the broker serves it; an error fails t.
func GetRun(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, id string) *gpupassv1.Run {
	t.Helper()
	resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
	if err != nil {
		t.Fatalf("run %s: %v", id, err)
	}
	return resp.Msg.Run
}

// RunNamed is the listed run that `gpupass train --name name` made (its
// name is name and a suffix); nil when none is listed or the listing
// fails, so that it can be polled.
func RunNamed(ctx context.Context, rc *brokerclient.RunClients, name string) *gpupassv1.Run {
	resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil {
		return nil
	}
	for _, r := range resp.Msg.Runs {
		if strings.HasPrefix(r.Name, name+"-") {
			return r
		}
	}
	return nil
}

// Terminal says whether r has ended: succeeded, failed or cancelled.
func Terminal(r *gpupassv1.Run) bool {
	switch r.State {
	case gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, gpupassv1.AllocState_ALLOC_STATE_FAILED, gpupassv1.AllocState_ALLOC_STATE_CANCELLED:
		return true
	}
	return false
}

// Training says whether r runs and has held its node for more than 5 s:
// past its start, not merely placed.
func Training(r *gpupassv1.Run) bool {
	return r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING && r.HeldThrough > 5
}

// WaitRun waits (WaitFor, naming what) until the run named name is listed
// and cond holds for it, and returns it.
func WaitRun(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, name, what string, cond func(*gpupassv1.Run) bool) *gpupassv1.Run {
	t.Helper()
	var run *gpupassv1.Run
	WaitFor(t, ctx, what, func() bool {
		run = RunNamed(ctx, rc, name)
		return run != nil && cond(run)
	})
	return run
}

// WaitEnd waits until the run (or rank) id has ended, and returns it.
func WaitEnd(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, id string) *gpupassv1.Run {
	t.Helper()
	var run *gpupassv1.Run
	WaitFor(t, ctx, id+" to end", func() bool {
		run = GetRun(t, ctx, rc, id)
		return Terminal(run)
	})
	return run
}

// WaitGang waits until `gpupass validate --spec spec --dry-run --region
// region` shows a gang of n nodes there (n node IDs in one line),
// and returns its output; it fails t with the last output when ctx ends
// first.
func (s *Stack) WaitGang(t testing.TB, ctx context.Context, spec, region string, n int) string {
	t.Helper()
	gang := regexp.MustCompile(strconv.Itoa(n) + ` × [^,\s]+` + strings.Repeat(`, [^,\s]+`, n-1) + ` in ` + regexp.QuoteMeta(region) + ` `)
	var out []byte
	for {
		out, _ = s.Command(ctx, "validate", "--spec", spec, "--dry-run", "--region", region).CombinedOutput()
		if gang.Match(out) {
			return string(out)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no gang of %d nodes in %s in `gpupass validate --spec %s --dry-run` in time:\n%s", n, region, spec, Tail(string(out), 3000))
		case <-time.After(time.Second):
		}
	}
}

// CheckLog reads a rank's whole log (RunLog fails on a gap or a repeated
// record) and fails t unless the broker holds all of it: as many records
// as its last seq, and the log marked complete.
func CheckLog(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, id string) string {
	t.Helper()
	text, n := RunLog(t, ctx, rc, id)
	r := GetRun(t, ctx, rc, id)
	if n != r.LastSeq || !r.LogComplete {
		t.Errorf("%s: %d records read, last seq %d, log complete %v: want every record once", id, n, r.LastSeq, r.LogComplete)
	}
	return text
}

// ReferenceCurve trains examples/ddp (in the checkout at root) with py as
// one process, with no rendezvous and the same global batch as a gang's,
// for steps steps, and returns its metrics file and its loss by step:
// the curve a gang of any size must give.
func ReferenceCurve(t testing.TB, ctx context.Context, py, root string, steps int) (file string, loss map[int64]float64) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "metrics.jsonl")
	one := exec.CommandContext(ctx, py, filepath.Join(root, "examples", "ddp", "train_ddp.py"), "--steps", strconv.Itoa(steps))
	one.Env = append(os.Environ(), "GPUPASS_METRICS_FILE="+file)
	if out, err := one.CombinedOutput(); err != nil {
		t.Fatalf("1 rank: %v\n%s", err, out)
	}
	series, err := metrics.ReadFile(file, metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	loss = map[int64]float64{}
	for _, p := range series.Points {
		loss[p.Step] = p.Value
	}
	return file, loss
}

// Loss is the loss curve of run id as the broker serves it: each step's
// last "loss" value (a restarted gang logs the steps after its
// checkpoint again), and how many points it served in all (more than
// the curve's steps when a step came more than once).
func Loss(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, id string) (loss map[int64]float64, points int) {
	t.Helper()
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
	if err != nil {
		t.Fatal(err)
	}
	loss = map[int64]float64{}
	for _, p := range mr.Msg.Points {
		loss[p.Step] = p.Values["loss"]
	}
	return loss, len(mr.Msg.Points)
}

// MaxDelta is the largest |got - want| over want's steps: +Inf where got
// lacks a step, NaN where either value is NaN, so that only a curve
// with every step close passes `MaxDelta(…) <= tolerance`.
func MaxDelta(want, got map[int64]float64) float64 {
	var worst float64
	for step, w := range want {
		g, ok := got[step]
		if !ok {
			return math.Inf(1)
		}
		if d := math.Abs(w - g); d > worst || math.IsNaN(d) {
			worst = d
		}
	}
	return worst
}

// StepAtLeast says whether run id's metrics have reached step: for
// WaitFor, before a rank is killed past a checkpoint.
func StepAtLeast(ctx context.Context, rc *brokerclient.RunClients, id string, step int64) bool {
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
	return err == nil && len(mr.Msg.Points) > 0 && mr.Msg.Points[len(mr.Msg.Points)-1].Step >= step
}

// JobProcess is the pid of a process on this machine of the run (or
// rank) alloc, by its GPUPASS_ALLOC_ID, whose command line holds arg; 0
// when none. Local agents and the Slurm test cluster's nodes run their
// jobs on this machine.
func JobProcess(alloc, arg string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	mark := []byte("GPUPASS_ALLOC_ID=" + alloc + "\x00")
	for _, d := range dirs {
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(env, append([]byte{0}, mark...)) && !bytes.HasPrefix(env, mark) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		if bytes.Contains(cmd, []byte(arg)) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}

// Kill9JobProcess kills (SIGKILL, as the OOM killer or a crash would)
// the process JobProcess finds for alloc and arg; none there, or a kill
// that fails, fails t.
func Kill9JobProcess(t testing.TB, alloc, arg string) {
	t.Helper()
	pid := JobProcess(alloc, arg)
	if pid == 0 {
		t.Fatalf("no process of %s (%s) to kill", alloc, arg)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
}

// RankLink is what a rank's signed run report says of the link measured
// at gang start, and of its check.
type RankLink struct {
	AllocID   string `json:"alloc_id"`
	Simulated bool   `json:"simulated"`
	Link      *struct {
		Backend      string  `json:"backend"`
		Ranks        int     `json:"ranks"`
		BusBWGbps    float64 `json:"busbw_gbps"`
		DeclaredGbps float64 `json:"declared_gbps"`
		Shortfall    bool    `json:"shortfall"`
		MasterAddr   string  `json:"master_addr"`
		Simulated    bool    `json:"simulated"`
		Error        string  `json:"error"`
		Warm         bool    `json:"warm"`
		InCommand    bool    `json:"in_command"`
		Torch        string  `json:"torch"`
		MeasuredBy   string  `json:"measured_by"`
	} `json:"link"`
	Checks []struct{ Name, Status, Message string } `json:"checks"`
}

// RankLinks reads every rank's signed run report of the run from
// GetRunEvidence, by rank (rank 0's is the run's own report).
func RankLinks(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, run string) map[int]RankLink {
	t.Helper()
	ev, err := rc.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: run}))
	if err != nil {
		t.Fatalf("evidence of %s: %v", run, err)
	}
	reports := map[int][]byte{0: ev.Msg.Report}
	for _, r := range ev.Msg.GetRanks() {
		reports[int(r.Rank)] = r.Report
	}
	out := map[int]RankLink{}
	for rank, b := range reports {
		var r RankLink
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("rank %d's signed report of %s: %v", rank, run, err)
		}
		out[rank] = r
	}
	return out
}

// CheckBandwidthRefused checks a gang that `train --require-bandwidth`
// (whose outcome are out and err) ran with a declared figure of 25
// Gbit/s above what its link measured: the command failed, the run
// failed naming both figures, no rank's log has a line trained says is
// the training's, every rank's log names both figures, and at least one
// has the step's own words (the first rank to exit 3 ends the others
// with it).
func CheckBandwidthRefused(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, run *gpupassv1.Run, out []byte, err error, trained func(log string) bool) {
	t.Helper()
	t.Logf("with --require-bandwidth: %v, %s: %s", err, run.State, run.Reason)
	if err == nil || run.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(run.Reason, "below the declared 25 Gbit/s") ||
		!strings.Contains(run.Reason, "--require-bandwidth") || !regexp.MustCompile(`measured [0-9.]+ Gbit/s`).MatchString(run.Reason) {
		t.Errorf("train --require-bandwidth: %v, run %s (%s); want failed naming the measured and the declared figure\n%s", err, run.State, run.Reason, Tail(string(out), 3000))
	}
	said := 0
	for _, id := range []string{run.Id, run.Id + "-r1"} {
		log, _ := RunLog(t, ctx, rc, id)
		if trained(log) {
			t.Errorf("%s's log has a training line: the run should have ended before the training command\n%s", id, Tail(log, 3000))
		}
		if !strings.Contains(log, "below the declared 25 Gbit/s (--require-bandwidth)") {
			t.Errorf("%s's log does not name both figures:\n%s", id, Tail(log, 3000))
		}
		if strings.Contains(log, "below the declared 25 Gbit/s (--require-bandwidth): the command does not start") {
			said++
		}
	}
	if said == 0 {
		t.Error("no rank's log says the link step ended its rank before the command")
	}
}
