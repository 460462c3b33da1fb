package gpupass_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// runPlan is what a compareAgent does with every run it is given.
type runPlan struct {
	steps    int
	scale    float64 // loss = scale * 2 / step
	restarts int32
	// end is SUCCEEDED, FAILED or RUNNING (the run never ends).
	end    gpupassv1.AllocState
	reason string
}

// compareAgent works runs over the real agent protocol: running, one
// metric record per step stamped with the agent's clock (so time to first
// step and cost are real durations on the broker's record), restarts
// reported on the run record, then the planned end.
func compareAgent(t *testing.T, url, tok string, n brokertest.NodeSpec, plan runPlan) {
	t.Helper()
	protocolAgent(t, url, tok, n, func(ctx context.Context, c *client.RunClients, agentID string, as *gpupassv1.Assignment) {
		update := func(st gpupassv1.AllocState, reason string, last uint64) {
			_, _ = c.Work.UpdateAllocation(ctx, connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: agentID, AllocId: as.AllocId,
				FencingToken: as.FencingToken, State: st, Reason: reason, Attempts: plan.restarts + 1, Restarts: plan.restarts, LastSeq: last}))
		}
		update(gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0)
		update(gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0)
		var recs []*gpupassv1.Record
		for step := 1; step <= plan.steps; step++ {
			time.Sleep(2 * time.Millisecond) // distinct timestamps
			ts := time.Now().UTC().Format(time.RFC3339Nano)
			recs = append(recs, &gpupassv1.Record{Seq: uint64(step), Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC,
				Data: fmt.Appendf(nil, `{"step":%d,"ts":%q,"attempt":1,"values":{"loss":%g}}`, step, ts, plan.scale*2/float64(step))})
		}
		if _, err := c.Work.UploadRecords(ctx, connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: agentID, AllocId: as.AllocId,
			FencingToken: as.FencingToken, Records: recs})); err != nil {
			t.Errorf("uploading records of %s: %v", as.AllocId, err)
		}
		if plan.end != gpupassv1.AllocState_ALLOC_STATE_RUNNING {
			update(plan.end, plan.reason, uint64(plan.steps))
		}
	})
}

type compareRunJSON struct {
	Label           string   `json:"label"`
	Source          string   `json:"source"`
	Points          int      `json:"points"`
	LastStep        int64    `json:"last_step"`
	FinalLoss       float64  `json:"final_loss"`
	TimeToFirstStep *float64 `json:"time_to_first_step_seconds"`
	CostUSD         *float64 `json:"cost_usd"`
	PricePerHour    float64  `json:"price_per_hour"`
	Restarts        int      `json:"restarts"`
	Notes           []string `json:"notes"`
}

type compareJSON struct {
	Verdict string           `json:"verdict"`
	Runs    []compareRunJSON `json:"runs"`
	Pairs   []struct {
		A, B        string
		CommonSteps int `json:"common_steps"`
		Verdict     string
	} `json:"pairs"`
}

// TestCompareAllocationsFromBroker compares allocations of a real broker
// (SQLite) worked by protocol-level agents: the figures that only the run
// record knows (price per hour, restarts, start time) reach the report,
// a failed run says how it ended, runs of one region get distinct labels,
// and an unfinished or unknown run is refused with a message that says
// what to do.
func TestCompareAllocationsFromBroker(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	compareAgent(t, b.URL, agentTok, brokertest.H100("us-west-2", 20), runPlan{steps: 30, scale: 1, restarts: 2, end: gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED})
	compareAgent(t, b.URL, agentTok, brokertest.H100("eu-central-1", 21), runPlan{steps: 30, scale: 1.5, end: gpupassv1.AllocState_ALLOC_STATE_FAILED, reason: "command exited with code 3"})
	compareAgent(t, b.URL, agentTok, brokertest.H100("sa-east-1", 20), runPlan{steps: 12, scale: 1, end: gpupassv1.AllocState_ALLOC_STATE_RUNNING})
	// A node that never takes work: runs placed there stay matched.
	brokertest.Register(t, b.URL, agentTok, brokertest.H100("ap-south-1", 20))
	// A node priced far above the others: its health score keeps every
	// run off it, so a run there fails before it logs anything.
	brokertest.Register(t, b.URL, agentTok, brokertest.H100("me-south-1", 60))
	tok := b.Token(t, store.RoleSubmit, "*")
	broker := []string{"--broker-url", b.URL, "--broker-token", tok}
	spec := writeH100Spec(t)
	rc, err := client.DialRuns(b.URL, client.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	submit := func(region string, follow bool) string {
		t.Helper()
		args := append([]string{"train", "--spec", spec, "--region", region}, broker...)
		if follow {
			args = append(args, "--follow")
		}
		code, out, errOut := runMain(t, append(args, "--", "python3", "train.py")...)
		id := allocRE.FindString(out)
		if id == "" || (follow && code != 0 && region != "eu-central-1") {
			t.Fatalf("train in %s: exit %d\n%s\n%s", region, code, out, errOut)
		}
		return id
	}
	getRun := func(id string) *gpupassv1.Run {
		t.Helper()
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Run
	}
	us, eu := submit("us-west-2", true), submit("eu-central-1", true)
	us2 := submit("us-west-2", true)
	sa := submit("sa-east-1", false)
	ap := submit("ap-south-1", false)
	me := submit("me-south-1", false)
	waitFor(t, "the sa-east-1 run to hold its metrics", func() bool {
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: sa}))
		return err == nil && len(mr.Msg.Points) == 12
	})

	compare := func(args ...string) (compareJSON, int, string) {
		t.Helper()
		code, out, errOut := runMain(t, append(append([]string{"compare", "--post", "none", "-o", "json"}, args...), broker...)...)
		var got compareJSON
		if code != 2 {
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("compare %v: exit %d, stdout is not JSON: %v\n%s\n%s", args, code, err, out, errOut)
			}
		}
		return got, code, errOut
	}

	got, code, errOut := compare(us, eu, "--tolerance", "abs=10")
	if code != 0 {
		t.Fatalf("compare us eu: exit %d: %s", code, errOut)
	}
	for i, id := range []string{us, eu} {
		run, r := getRun(id), got.Runs[i]
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
		if err != nil {
			t.Fatal(err)
		}
		pts := mr.Msg.Points
		first, last := pts[0], pts[len(pts)-1]
		wantTTF := float64(first.TimeUnixNano-run.StartedUnixNano) / 1e9
		wantCost := float64(last.TimeUnixNano-run.StartedUnixNano) / 3.6e12 * run.PricePerHour
		if r.Label != run.Region || r.Source != "broker:"+id || r.Points != 30 || r.LastStep != 30 || r.FinalLoss != last.Values["loss"] {
			t.Errorf("run %d: %+v, want label %s, 30 points, final loss %v (the API's)", i, r, run.Region, last.Values["loss"])
		}
		if r.Restarts != int(run.Restarts) || r.PricePerHour != run.PricePerHour || run.PricePerHour == 0 {
			t.Errorf("%s: restarts %d price %v, want the run record's %d and %v", r.Label, r.Restarts, r.PricePerHour, run.Restarts, run.PricePerHour)
		}
		if r.TimeToFirstStep == nil || math.Abs(*r.TimeToFirstStep-wantTTF) > 1e-9 || wantTTF <= 0 {
			t.Errorf("%s: time to first step %v, want %v (first metric minus the run's start)", r.Label, r.TimeToFirstStep, wantTTF)
		}
		if r.CostUSD == nil || math.Abs(*r.CostUSD-wantCost) > 1e-12 {
			t.Errorf("%s: cost %v, want %v (price per hour of the node × time since start)", r.Label, r.CostUSD, wantCost)
		}
	}
	if got.Runs[0].Restarts != 2 {
		t.Errorf("us restarts %d, want 2 from the run record", got.Runs[0].Restarts)
	}
	if notes := strings.Join(got.Runs[1].Notes, "\n"); !strings.Contains(notes, "the run ended failed: command exited with code 3") {
		t.Errorf("failed run's notes %q lack how it ended", notes)
	}

	// Two runs of one region: labelled by region and id, not refused.
	got, code, errOut = compare(us, us2)
	if code != 0 || len(got.Runs) != 2 || got.Runs[0].Label != "us-west-2 "+us || got.Runs[1].Label != "us-west-2 "+us2 || got.Pairs[0].CommonSteps != 30 {
		t.Errorf("same region: exit %d %+v\n%s", code, got, errOut)
	}
	// Explicit labels that clash are still an error.
	if _, code, errOut = compare("--label", "a="+us, "--label", "a="+us2); code != 2 || !strings.Contains(errOut, `the name "a" is given twice`) {
		t.Errorf("duplicate --label: exit %d %s", code, errOut)
	}

	if st := getRun(sa).State; st != gpupassv1.AllocState_ALLOC_STATE_RUNNING {
		t.Fatalf("sa-east-1 run is %s, want running", st)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"running", []string{us, sa}, sa + " (sa-east-1) is still running (12 points so far, last step 12): its final figures are not known yet; compare it once it has ended (`gpupass logs " + sa + " --follow` waits for it), or pass --allow-running"},
		{"matched, no metrics", []string{us, ap, "--allow-running"}, ap + " (ap-south-1) is still matched and has logged no metrics yet"},
		{"failed before any metric", []string{us, me}, me + " (me-south-1) ended failed without logging loss values: no candidate node in me-south-1"},
		{"unknown", []string{us, "alloc-00000000"}, "alloc-00000000: no such run on the broker at " + b.URL},
	}
	for _, tc := range tests {
		_, code, errOut := compare(tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d stderr %q, want 2 and %q", tc.name, code, errOut, tc.want)
		}
		if strings.Contains(errOut, tok) {
			t.Errorf("%s: the broker token is in the message", tc.name)
		}
	}
	got, code, errOut = compare(us, sa, "--allow-running")
	if code != 0 || got.Runs[1].Points != 12 || got.Pairs[0].CommonSteps != 12 || !strings.Contains(strings.Join(got.Runs[1].Notes, "\n"), sa+" was still running when compared: its figures are partial") {
		t.Errorf("--allow-running: exit %d %+v\n%s", code, got, errOut)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCompareBrokerRunRestartOnTheChart: a run the agent's NaN guard
// restarted from its checkpoint logs the NaN step again in its next
// attempt, with no restart event. compare reads that from the broker's
// attempts and marks it on the chart (the demo's NaN at step 51 showed
// nowhere on its chart: only the runs table's restart count said it).
func TestCompareBrokerRunRestartOnTheChart(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	protocolAgent(t, b.URL, agentTok, brokertest.H100("us-west-2", 20), func(ctx context.Context, c *client.RunClients, agentID string, as *gpupassv1.Assignment) {
		update := func(st gpupassv1.AllocState, restarts int32, last uint64) {
			_, _ = c.Work.UpdateAllocation(ctx, connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: agentID, AllocId: as.AllocId,
				FencingToken: as.FencingToken, State: st, Attempts: restarts + 1, Restarts: restarts, LastSeq: last}))
		}
		update(gpupassv1.AllocState_ALLOC_STATE_STARTING, 0, 0)
		update(gpupassv1.AllocState_ALLOC_STATE_RUNNING, 0, 0)
		var recs []*gpupassv1.Record
		add := func(step, attempt int, loss string) {
			ts := time.Now().UTC().Format(time.RFC3339Nano)
			recs = append(recs, &gpupassv1.Record{Seq: uint64(len(recs) + 1), Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC,
				Data: fmt.Appendf(nil, `{"step":%d,"ts":%q,"attempt":%d,"values":{"loss":%s}}`, step, ts, attempt, loss)})
		}
		for step := 1; step <= 10; step++ {
			add(step, 1, fmt.Sprint(1/float64(step)))
		}
		add(11, 1, `"NaN"`) // the guard stops the process here
		for step := 11; step <= 20; step++ {
			add(step, 2, fmt.Sprint(1/float64(step)))
		}
		if _, err := c.Work.UploadRecords(ctx, connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: agentID, AllocId: as.AllocId,
			FencingToken: as.FencingToken, Records: recs})); err != nil {
			t.Errorf("uploading records of %s: %v", as.AllocId, err)
		}
		update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 1, uint64(len(recs)))
	})
	tok := b.Token(t, store.RoleSubmit, "*")
	broker := []string{"--broker-url", b.URL, "--broker-token", tok}
	code, out, errOut := runMain(t, append([]string{"train", "--spec", writeH100Spec(t), "--region", "us-west-2", "--follow"}, append(broker, "--", "python3", "train.py")...)...)
	id := allocRE.FindString(out)
	if code != 0 || id == "" {
		t.Fatalf("train: exit %d\n%s\n%s", code, out, errOut)
	}
	svg := filepath.Join(t.TempDir(), "chart.svg")
	code, out, errOut = runMain(t, append([]string{"compare", "--post", "none", "--svg", svg, id}, broker...)...)
	if code != 0 {
		t.Fatalf("compare: exit %d\n%s\n%s", code, out, errOut)
	}
	b2, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	// The broker's series keeps the value step 11 was logged again with
	// (the NaN is superseded); the attempt says the run restarted there.
	if want := "us-west-2: restarted at step 11 (after 10) (▲)"; !strings.Contains(string(b2), want) {
		t.Errorf("the chart lacks %q:\n%s", want, b2)
	}
}
