package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/spec"
)

// worker is an API-level agent speaking the real run protocol (gRPC,
// like gpupass-agent) with a real enrolled identity.
type worker struct {
	*brokertest.Agent
	runs *client.RunClients
}

func newWorker(t *testing.T, b *brokertest.Broker, tok string, n brokertest.NodeSpec) *worker {
	t.Helper()
	a := brokertest.Register(t, b.URL, tok, n)
	return &worker{Agent: a, runs: a.Runs(t, b.URL, tok)}
}

// keepAlive beats until the test ends or stop is called (a node that
// goes silent after taking its run).
func (w *worker) keepAlive(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				_, _ = w.Beat(ctx)
			}
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func (w *worker) poll(t *testing.T, wait int32) *gpupassv1.Assignment {
	t.Helper()
	resp, err := w.runs.Work.PollWork(context.Background(), connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: w.ID, WaitSeconds: wait}))
	if err != nil {
		t.Fatalf("PollWork: %v", err)
	}
	return resp.Msg.Assignment
}

func (w *worker) update(as *gpupassv1.Assignment, st gpupassv1.AllocState, reason string, lastSeq uint64) (*gpupassv1.UpdateAllocationResponse, error) {
	resp, err := w.runs.Work.UpdateAllocation(context.Background(), connect.NewRequest(&gpupassv1.UpdateAllocationRequest{
		AgentId: w.ID, AllocId: as.AllocId, FencingToken: as.FencingToken, State: st, Reason: reason, Attempts: 1, LastSeq: lastSeq}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (w *worker) upload(as *gpupassv1.Assignment, recs []*gpupassv1.Record) (uint64, error) {
	resp, err := w.runs.Work.UploadRecords(context.Background(), connect.NewRequest(&gpupassv1.UploadRecordsRequest{
		AgentId: w.ID, AllocId: as.AllocId, FencingToken: as.FencingToken, Records: recs}))
	if err != nil {
		return 0, err
	}
	return resp.Msg.HeldThrough, nil
}

// records makes seqs from..to: every third a metric point (step = seq).
func records(from, to uint64) []*gpupassv1.Record {
	var out []*gpupassv1.Record
	for s := from; s <= to; s++ {
		if s%3 == 0 {
			out = append(out, &gpupassv1.Record{Seq: s, Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC,
				Data: fmt.Appendf(nil, `{"step":%d,"ts":"2026-11-29T12:00:00Z","attempt":1,"values":{"loss":%d}}`, s, 100-s)})
			continue
		}
		out = append(out, &gpupassv1.Record{Seq: s, Kind: gpupassv1.RecordKind_RECORD_KIND_EVENT,
			Data: fmt.Appendf(nil, `{"ts":"2026-11-29T12:00:00Z","level":"INFO","component":"trainer","msg":"line %d"}`, s)})
	}
	return out
}

func submit(t *testing.T, c *client.RunClients, region string, mod func(*gpupassv1.SubmitRequest)) *gpupassv1.Run {
	t.Helper()
	req := &gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: region,
		Command: []string{"python3", "train.py"}}
	if mod != nil {
		mod(req)
	}
	resp, err := c.Run.Submit(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return resp.Msg.Run
}

func getRun(t *testing.T, c *client.RunClients, id string) *gpupassv1.Run {
	t.Helper()
	resp, err := c.Run.GetRun(context.Background(), connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
	if err != nil {
		t.Fatalf("GetRun %s: %v", id, err)
	}
	return resp.Msg.Run
}

// waitRun polls GetRun until cond holds (no fixed sleeps).
func waitRun(t *testing.T, c *client.RunClients, id string, what string, cond func(*gpupassv1.Run) bool) *gpupassv1.Run {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := getRun(t, c, id)
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never got %s; last: %v %s", id, what, r.State, r.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dialRuns(t *testing.T, b *brokertest.Broker, tok string) *client.RunClients {
	t.Helper()
	c, err := client.DialRuns(b.URL, client.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRunLifecycle(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			agentTok := b.Token(t, store.RoleAgent, "*")
			cheap := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20))
			dear := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 26))
			cheap.keepAlive(t)
			dear.keepAlive(t)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))

			run := submit(t, c, "us-west-2", func(r *gpupassv1.SubmitRequest) { r.Name = "bert" })
			if run.State != gpupassv1.AllocState_ALLOC_STATE_MATCHED || run.NodeId != cheap.ID || run.Name != "bert-us-west-2" ||
				!strings.HasPrefix(run.Id, "alloc-") || len(run.Id) != len("alloc-8a3f9b21") || run.Score.GetScore() <= 0 {
				t.Fatalf("submitted run = %v", run)
			}
			as := cheap.poll(t, 5)
			if as == nil || as.AllocId != run.Id || as.FencingToken == 0 || as.MaxRestarts != 3 || !cmp.Equal(as.Command, []string{"python3", "train.py"}) {
				t.Fatalf("assignment = %v", as)
			}
			if other := dear.poll(t, 1); other != nil {
				t.Fatalf("the other node got the run too: %v", other)
			}
			// The spec reaches the node in its one wire form with the
			// fingerprint the CLI computes of the file, to check again.
			cli := spec.Validate("gpupass.yaml", specYAML(t))
			wire, err := spec.Encode(cli.Spec)
			if err != nil {
				t.Fatal(err)
			}
			if run.SpecFingerprint != cli.Fingerprint || as.SpecFingerprint != cli.Fingerprint || string(as.SpecJson) != string(wire) {
				t.Errorf("run fingerprint %s, assignment's %s, the CLI's %s; assignment spec %s, want %s",
					run.SpecFingerprint, as.SpecFingerprint, cli.Fingerprint, as.SpecJson, wire)
			}

			// A follower started now sees every record and the end.
			type followed struct {
				seqs []uint64
				last *gpupassv1.Run
				err  error
			}
			done := make(chan followed, 1)
			go func() {
				var f followed
				st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, Follow: true, IncludeMetrics: true}))
				if err != nil {
					f.err = err
					done <- f
					return
				}
				for st.Receive() {
					for _, r := range st.Msg().Records {
						f.seqs = append(f.seqs, r.Seq)
					}
					if st.Msg().Run != nil {
						f.last = st.Msg().Run
					}
				}
				f.err = st.Err()
				done <- f
			}()

			for _, st := range []gpupassv1.AllocState{gpupassv1.AllocState_ALLOC_STATE_STARTING, gpupassv1.AllocState_ALLOC_STATE_RUNNING,
				gpupassv1.AllocState_ALLOC_STATE_RUNNING} { // the repeat is a retried call
				if _, err := cheap.update(as, st, "", 0); err != nil {
					t.Fatalf("update %v: %v", st, err)
				}
			}
			steps := []struct {
				name string
				recs []*gpupassv1.Record
				held uint64
			}{
				{"first batch", records(1, 50), 50},
				{"sent again after a lost reply", records(1, 50), 50},
				{"after a gap", records(61, 70), 50},
				{"gap filled", records(51, 60), 70},
			}
			for _, s := range steps {
				held, err := cheap.upload(as, s.recs)
				if err != nil || held != s.held {
					t.Fatalf("%s: held %d, %v; want %d", s.name, held, err, s.held)
				}
			}
			if _, err := cheap.upload(as, []*gpupassv1.Record{{Seq: 0, Kind: gpupassv1.RecordKind_RECORD_KIND_EVENT}}); brokertest.Code(err) != connect.CodeInvalidArgument {
				t.Errorf("seq 0: err = %v, want invalid_argument", err)
			}
			if _, err := cheap.update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "", 70); err != nil {
				t.Fatal(err)
			}
			if _, err := cheap.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 70); brokertest.Code(err) != connect.CodeFailedPrecondition {
				t.Errorf("moving a finished run back: err = %v, want failed_precondition", err)
			}

			f := <-done
			if f.err != nil {
				t.Fatalf("follow: %v", f.err)
			}
			if len(f.seqs) != 70 || f.seqs[0] != 1 || f.seqs[69] != 70 {
				t.Errorf("follower got %d records (%v…), want seq 1..70 once each", len(f.seqs), f.seqs[:min(5, len(f.seqs))])
			}
			for i, s := range f.seqs {
				if s != uint64(i+1) {
					t.Fatalf("follower record %d has seq %d: lost or duplicated", i, s)
				}
			}
			if f.last.GetState() != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || f.last.Reason != "exited with code 0" {
				t.Errorf("final run = %v", f.last)
			}

			// Logs without metrics; metrics as one series.
			st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, AfterSeq: 60}))
			if err != nil {
				t.Fatal(err)
			}
			var evs []uint64
			for st.Receive() {
				for _, r := range st.Msg().Records {
					if r.Kind != gpupassv1.RecordKind_RECORD_KIND_EVENT {
						t.Errorf("logs without metrics sent a %v", r.Kind)
					}
					evs = append(evs, r.Seq)
				}
			}
			if diff := cmp.Diff([]uint64{61, 62, 64, 65, 67, 68, 70}, evs); diff != "" || st.Err() != nil {
				t.Errorf("events after 60 (-want +got):\n%s %v", diff, st.Err())
			}
			mr, err := c.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: run.Id}))
			if err != nil {
				t.Fatal(err)
			}
			if len(mr.Msg.Points) != 23 || mr.Msg.Points[0].Step != 3 || mr.Msg.Points[0].Values["loss"] != 97 || mr.Msg.Run.Region != "us-west-2" {
				t.Errorf("metrics = %d points, first %v", len(mr.Msg.Points), mr.Msg.Points[0])
			}

			got := getRun(t, c, run.Id)
			if got.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || got.HeldThrough != 70 || got.StartedUnixNano == 0 || got.FinishedUnixNano == 0 {
				t.Errorf("final GetRun = %v", got)
			}
			list, err := c.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
			if err != nil || len(list.Msg.Runs) != 1 || list.Msg.Runs[0].Id != run.Id {
				t.Errorf("ListRuns = %v, %v", list, err)
			}

			// The successful launch counts in the node's 24 h statistics.
			nodes, err := b.Clients(t, b.Token(t, store.RoleRead, "*")).Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes.Msg.Nodes {
				if n.Id == cheap.ID && (n.Health.Launches_24H != 1 || n.Health.LaunchFailures_24H != 0) {
					t.Errorf("launch stats of the node = %d launches, %d failures; want 1, 0", n.Health.Launches_24H, n.Health.LaunchFailures_24H)
				}
			}
		})
	}
}

func TestRunScopeAndRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20)).keepAlive(t)
	newWorker(t, b, agentTok, brokertest.H100("eu-central-1", 20)).keepAlive(t)
	us := dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*"))
	all := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	reader := dialRuns(t, b, b.Token(t, store.RoleRead, "*"))

	euRun := submit(t, all, "eu-central-1", nil)
	if euRun.State != gpupassv1.AllocState_ALLOC_STATE_MATCHED || euRun.Name != "llm-finetune-eu-central-1" {
		t.Fatalf("eu run = %v", euRun)
	}
	tests := []struct {
		name string
		call func() error
		want connect.Code
	}{
		{"submit outside scope", func() error {
			_, err := us.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "eu-central-1", Command: []string{"true"}}))
			return err
		}, connect.CodePermissionDenied},
		{"read a run outside scope", func() error {
			_, err := us.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: euRun.Id}))
			return err
		}, connect.CodePermissionDenied},
		{"cancel a run outside scope", func() error {
			_, err := us.Run.Cancel(ctx, connect.NewRequest(&gpupassv1.CancelRequest{AllocId: euRun.Id}))
			return err
		}, connect.CodePermissionDenied},
		{"logs of a run outside scope", func() error {
			st, err := us.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: euRun.Id}))
			if err != nil {
				return err
			}
			for st.Receive() {
			}
			return st.Err()
		}, connect.CodePermissionDenied},
		{"metrics of a run outside scope", func() error {
			_, err := us.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: euRun.Id}))
			return err
		}, connect.CodePermissionDenied},
		{"read a run that does not exist", func() error {
			_, err := us.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: "alloc-0000000000000000"}))
			return err
		}, connect.CodeNotFound},
		{"read token submits", func() error {
			_, err := reader.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-west-2", Command: []string{"true"}}))
			return err
		}, connect.CodePermissionDenied},
		{"region pattern", func() error {
			_, err := all.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-*", Command: []string{"true"}}))
			return err
		}, connect.CodeInvalidArgument},
		// Issue #32, item 5: a list, upper case or a space would be a
		// region of its own, kept in runs and the dashboard.
		{"region list", func() error {
			_, err := all.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-west-2,eu-central-1", Command: []string{"true"}}))
			return err
		}, connect.CodeInvalidArgument},
		{"region not lower case", func() error {
			_, err := all.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "US-West-2", Command: []string{"true"}}))
			return err
		}, connect.CodeInvalidArgument},
		{"no command", func() error {
			_, err := all.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-west-2"}))
			return err
		}, connect.CodeInvalidArgument},
		{"bad spec", func() error {
			_, err := all.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: []byte("name: ["), Region: "us-west-2", Command: []string{"true"}}))
			return err
		}, connect.CodeInvalidArgument},
		{"logs without a token", func() error {
			c := dialRuns(t, b, "")
			st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: euRun.Id}))
			if err != nil {
				return err
			}
			for st.Receive() {
			}
			return st.Err()
		}, connect.CodeUnauthenticated},
		{"agent token reads runs", func() error {
			_, err := dialRuns(t, b, agentTok).Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: euRun.Id}))
			return err
		}, connect.CodePermissionDenied},
	}
	for _, tt := range tests {
		if got := brokertest.Code(tt.call()); got != tt.want {
			t.Errorf("%s: code %v, want %v", tt.name, got, tt.want)
		}
	}
	list, err := us.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil || len(list.Msg.Runs) != 0 {
		t.Errorf("a us-* token lists %v, %v; want no runs", list, err)
	}

	// --max-price below every node: failed with the reason, never placed.
	cheapOnly := submit(t, all, "us-west-2", func(r *gpupassv1.SubmitRequest) { r.MaxPrice = 10 })
	if cheapOnly.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(cheapOnly.Reason, "above the maximum price 10/h") || cheapOnly.NodeId != "" {
		t.Errorf("run over max price = %v %q", cheapOnly.State, cheapOnly.Reason)
	}
	nowhere := submit(t, all, "ap-south-1", nil)
	if nowhere.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(nowhere.Reason, "no certified node in region ap-south-1") {
		t.Errorf("run in an empty region = %v %q", nowhere.State, nowhere.Reason)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	w := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
	w.keepAlive(t)
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	ctx := context.Background()
	cancel := func(id string) *gpupassv1.Run {
		t.Helper()
		resp, err := c.Run.Cancel(ctx, connect.NewRequest(&gpupassv1.CancelRequest{AllocId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Run
	}

	// Before start: cancelled at once; the agent that took it is refused.
	r1 := submit(t, c, "us-west-2", nil)
	as1 := w.poll(t, 5)
	if got := cancel(r1.Id); got.State != gpupassv1.AllocState_ALLOC_STATE_CANCELLED || got.Reason != "cancelled by user" {
		t.Fatalf("cancel before start = %v %q", got.State, got.Reason)
	}
	if _, err := w.update(as1, gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0); brokertest.Code(err) != connect.CodeFailedPrecondition {
		t.Errorf("starting a cancelled run: err = %v, want failed_precondition", err)
	}

	// Running: the agent learns it from its next call, then ends it.
	r2 := submit(t, c, "us-west-2", nil)
	as2 := w.poll(t, 5)
	if as2 == nil || as2.AllocId != r2.Id {
		t.Fatalf("assignment = %v, want %s", as2, r2.Id)
	}
	if _, err := w.update(as2, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
		t.Fatal(err)
	}
	if got := cancel(r2.Id); got.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING || !got.CancelRequested {
		t.Fatalf("cancel while running = %v cancel_requested=%v", got.State, got.CancelRequested)
	}
	resp, err := w.update(as2, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 3)
	if err != nil || !resp.CancelRequested {
		t.Fatalf("agent not told to cancel: %v %v", resp, err)
	}
	if _, err := w.update(as2, gpupassv1.AllocState_ALLOC_STATE_CANCELLED, "", 3); brokertest.Code(err) != connect.CodeInvalidArgument {
		t.Errorf("cancelled without reason: err = %v, want invalid_argument", err)
	}
	if _, err := w.update(as2, gpupassv1.AllocState_ALLOC_STATE_CANCELLED, "cancelled: cancelled by the broker", 3); err != nil {
		t.Fatal(err)
	}
	// The user's reason stays: the agent only knows the broker asked.
	if got := getRun(t, c, r2.Id); got.State != gpupassv1.AllocState_ALLOC_STATE_CANCELLED || got.Reason != "cancelled by user" {
		t.Errorf("after the agent stopped = %v %q", got.State, got.Reason)
	}
}

func TestNodeLoss(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cfg := brokertest.Fast()
			cfg.OfflineAfter = 3 * time.Second // beats every 100 ms; see TestResumeElsewhere
			b := brokertest.Start(t, brokertest.NewDB(t, kind), cfg)
			agentTok := b.Token(t, store.RoleAgent, "*")
			// first is the best candidate but stops beating after it took
			// the run; second stays alive.
			first := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20))
			second := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 22))
			second.keepAlive(t)
			silenceFirst := first.keepAlive(t)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))

			run := submit(t, c, "us-west-2", nil)
			if run.NodeId != first.ID {
				t.Fatalf("placed on %s, want the cheaper %s", run.NodeId, first.ID)
			}
			stale := first.poll(t, 5)
			if _, err := first.update(stale, gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0); err != nil {
				t.Fatal(err)
			}
			silenceFirst()
			// first goes silent: the run moves to second with a new token.
			moved := waitRun(t, c, run.Id, "re-placed", func(r *gpupassv1.Run) bool { return r.NodeId == second.ID })
			if moved.FencingToken != 0 || !cmp.Equal(moved.ReplacedNodes, []string{first.ID}) {
				t.Errorf("re-placed run = token %d (shown to a submit client), replaced %v", moved.FencingToken, moved.ReplacedNodes)
			}
			as := second.poll(t, 5)
			if as == nil || as.AllocId != run.Id || as.FencingToken == 0 || as.FencingToken == stale.FencingToken {
				t.Fatalf("second's assignment = %v", as)
			}
			// The old lease is fenced off.
			if _, err := first.update(stale, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); brokertest.Code(err) != connect.CodeFailedPrecondition {
				t.Errorf("stale update: err = %v, want failed_precondition", err)
			}
			if _, err := first.upload(stale, records(1, 3)); brokertest.Code(err) != connect.CodeFailedPrecondition {
				t.Errorf("stale upload: err = %v, want failed_precondition", err)
			}
			if _, err := second.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
				t.Fatal(err)
			}
			if held, err := second.upload(as, records(1, 3)); err != nil || held != 3 {
				t.Fatalf("upload by the new holder: %d, %v", held, err)
			}
			// The lost launch counts against first.
			nodes, err := b.Clients(t, b.Token(t, store.RoleRead, "*")).Node.ListNodes(context.Background(),
				connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes.Msg.Nodes {
				if n.Id == first.ID && n.Health.LaunchFailures_24H != 1 {
					t.Errorf("first's launch failures = %d, want 1", n.Health.LaunchFailures_24H)
				}
			}

			// Lost mid-run (without --resume-elsewhere): failed, node lost.
			run2 := submit(t, c, "us-west-2", nil) // second is busy, first offline: waits
			if run2.State != gpupassv1.AllocState_ALLOC_STATE_FAILED && run2.State != gpupassv1.AllocState_ALLOC_STATE_PENDING {
				t.Fatalf("second run = %v %q", run2.State, run2.Reason)
			}
			third := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 21))
			_ = third
			as3 := third.poll(t, 10)
			if as3 == nil {
				// run2 failed before third enrolled (no free candidate
				// and none busy): submit again.
				run2 = submit(t, c, "us-west-2", nil)
				as3 = third.poll(t, 10)
			}
			if as3 == nil || as3.AllocId != run2.Id {
				t.Fatalf("third's assignment = %v, want %s", as3, run2.Id)
			}
			if _, err := third.update(as3, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
				t.Fatal(err)
			}
			lost := waitRun(t, c, run2.Id, "failed", func(r *gpupassv1.Run) bool { return r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED })
			if !strings.HasPrefix(lost.Reason, "node lost") {
				t.Errorf("reason = %q, want node lost", lost.Reason)
			}
		})
	}
}

func TestRunsSurviveBrokerRestart(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			db := brokertest.NewDB(t, kind)
			b1 := brokertest.Start(t, db, brokertest.Fast())
			agentTok := b1.Token(t, store.RoleAgent, "*")
			submitTok := b1.Token(t, store.RoleSubmit, "*")
			w := newWorker(t, b1, agentTok, brokertest.H100("us-west-2", 20))
			run := submit(t, dialRuns(t, b1, submitTok), "us-west-2", nil)
			as := w.poll(t, 5)
			if _, err := w.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
				t.Fatal(err)
			}
			if held, err := w.upload(as, records(1, 40)); err != nil || held != 40 {
				t.Fatalf("before restart: %d, %v", held, err)
			}
			b1.Stop(t)

			// A new broker process on the same database: the lease, the
			// records and the tokens carry over.
			b2 := brokertest.Start(t, db, brokertest.Fast())
			w2 := &worker{Agent: w.Agent}
			var err error
			if w2.runs, err = client.DialRuns(b2.URL, client.Options{Token: agentTok, GRPC: true, Agent: w.Creds}); err != nil {
				t.Fatal(err)
			}
			// The reply to the last batch was "lost": the agent sends it again.
			if held, err := w2.upload(as, records(31, 60)); err != nil || held != 60 {
				t.Fatalf("after restart: %d, %v", held, err)
			}
			if _, err := w2.update(as, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "", 60); err != nil {
				t.Fatal(err)
			}
			c := dialRuns(t, b2, submitTok)
			st, err := c.Run.GetLogs(context.Background(), connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, Follow: true, IncludeMetrics: true}))
			if err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for st.Receive() {
				for _, r := range st.Msg().Records {
					seqs = append(seqs, r.Seq)
				}
			}
			if st.Err() != nil || len(seqs) != 60 || seqs[59] != 60 {
				t.Fatalf("records after restart: %d (err %v), want seq 1..60 once each", len(seqs), st.Err())
			}
			if got := getRun(t, c, run.Id); got.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || got.HeldThrough != 60 {
				t.Errorf("run after restart = %v held %d", got.State, got.HeldThrough)
			}
		})
	}
}

func TestResumeElsewhere(t *testing.T) {
	t.Parallel()
	cfg := brokertest.Fast()
	// Beats come every 100 ms: 3 s of silence is a lost node, not a
	// loaded test machine (1 s failed once under -race at load 8).
	cfg.OfflineAfter = 3 * time.Second
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	agentTok := b.Token(t, store.RoleAgent, "*")
	first := newWorker(t, b, agentTok, brokertest.H100("eu-central-1", 20))
	second := newWorker(t, b, agentTok, brokertest.H100("eu-central-1", 22))
	second.keepAlive(t)
	// first beats until it took the run (a slow test machine must not
	// lose it before), then goes silent.
	silenceFirst := first.keepAlive(t)
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	run := submit(t, c, "eu-central-1", func(r *gpupassv1.SubmitRequest) { r.ResumeElsewhere = true })
	as := first.poll(t, 5)
	if as == nil || run.NodeId != first.ID {
		t.Fatalf("placed on %s, assignment %v", run.NodeId, as)
	}
	if _, err := first.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
		t.Fatal(err)
	}
	// Two checkpoints travel among the records (the older one whole, the
	// newer one in two chunks); a third is cut short by the loss.
	recs := records(1, 12)
	ckpt := func(seq uint64, data []byte) *gpupassv1.Record {
		return &gpupassv1.Record{Seq: seq, Kind: gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT, Data: data}
	}
	newer := bytes.Repeat([]byte("n"), api.CheckpointChunk+5)
	nc := api.CheckpointChunks("ckpt-8.pt", newer)
	cut := api.CheckpointChunks("ckpt-12.pt", bytes.Repeat([]byte("c"), api.CheckpointChunk+5))
	recs[3] = ckpt(4, api.CheckpointChunks("ckpt-4.pt", []byte("older"))[0])
	recs[7], recs[8] = ckpt(8, nc[0]), ckpt(9, nc[1])
	recs[11] = ckpt(12, cut[0])
	if held, err := first.upload(as, recs); err != nil || held != 12 {
		t.Fatalf("upload: %d, %v", held, err)
	}
	silenceFirst()
	// first goes silent mid-run: the run resumes on second after seq 12,
	// from the newest whole checkpoint.
	as2 := second.poll(t, 20)
	if as2 == nil || as2.AllocId != run.Id || as2.ResumeAfterSeq != 12 || as2.FencingToken == 0 || as2.FencingToken == as.FencingToken {
		t.Fatalf("resumed assignment = %v", as2)
	}
	if as2.ResumeCheckpointName != "ckpt-8.pt" || !bytes.Equal(as2.ResumeCheckpoint, newer) {
		t.Errorf("resumed from %q (%d bytes), want ckpt-8.pt (%d bytes)", as2.ResumeCheckpointName, len(as2.ResumeCheckpoint), len(newer))
	}
	// Logs carry the chunks' header lines only, without a gap in seq.
	st, err := c.Run.GetLogs(context.Background(), connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, IncludeMetrics: true}))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var headers []string
	for st.Receive() {
		for _, r := range st.Msg().Records {
			seqs = append(seqs, r.Seq)
			if r.Kind == gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT {
				headers = append(headers, string(r.Data))
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, seqs); diff != "" {
		t.Errorf("logs with metrics (-want +got):\n%s", diff)
	}
	if len(headers) != 4 || !strings.HasPrefix(headers[1], `{"name":"ckpt-8.pt","size":1048581,`) || strings.Contains(headers[1], "\n") {
		t.Errorf("checkpoint records in the log: %q", headers)
	}
	got := getRun(t, c, run.Id)
	if got.State != gpupassv1.AllocState_ALLOC_STATE_MATCHED || got.NodeId != second.ID {
		t.Errorf("resumed run = %v on %s", got.State, got.NodeId)
	}
	if _, err := second.update(as2, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 12); err != nil {
		t.Fatal(err)
	}
	if held, err := second.upload(as2, records(13, 20)); err != nil || held != 20 {
		t.Fatalf("upload after resume: %d, %v", held, err)
	}
}

// TestStartTimeout: a live node that never takes its run loses it to the
// next candidate; one that took the lease and went quiet (its agent
// restarted) fails the run with a reason. Both count as failed launches.
func TestStartTimeout(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cfg := brokertest.Fast()
			// Long enough that a poll and its first update fit in it on
			// a loaded machine (CI saw 2.3 s from placement to update).
			cfg.StartTimeout = 4 * time.Second
			b := brokertest.Start(t, brokertest.NewDB(t, kind), cfg)
			agentTok := b.Token(t, store.RoleAgent, "*")
			first := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20))
			second := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 22))
			first.keepAlive(t)
			second.keepAlive(t)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))

			run := submit(t, c, "us-west-2", nil)
			if run.NodeId != first.ID {
				t.Fatalf("placed on %s, want the cheaper %s", run.NodeId, first.ID)
			}
			// first beats but never polls: the run moves to second.
			moved := waitRun(t, c, run.Id, "re-placed", func(r *gpupassv1.Run) bool { return r.NodeId == second.ID })
			if !cmp.Equal(moved.ReplacedNodes, []string{first.ID}) || moved.FencingToken != 0 {
				t.Errorf("re-placed run: replaced %v, token %d", moved.ReplacedNodes, moved.FencingToken)
			}
			as := second.poll(t, 5)
			if as == nil || as.AllocId != run.Id {
				t.Fatalf("second's assignment = %v", as)
			}
			if _, err := second.update(as, gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0); err != nil {
				t.Fatal(err)
			}
			// second took the lease and goes quiet while beating.
			failed := waitRun(t, c, run.Id, "failed", func(r *gpupassv1.Run) bool { return r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED })
			if !strings.HasPrefix(failed.Reason, "start timed out: node "+second.ID+" took the run but reported nothing for 4s") {
				t.Errorf("reason = %q", failed.Reason)
			}
			if _, err := second.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); brokertest.Code(err) != connect.CodeFailedPrecondition {
				t.Errorf("late running update: err = %v, want failed_precondition", err)
			}
			nodes, err := b.Clients(t, b.Token(t, store.RoleRead, "*")).Node.ListNodes(context.Background(),
				connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for _, n := range nodes.Msg.Nodes {
				got[n.Id] = n.Health.LaunchFailures_24H
			}
			if diff := cmp.Diff(map[string]int64{first.ID: 1, second.ID: 1}, got); diff != "" {
				t.Errorf("launch failures in 24 h (-want +got):\n%s", diff)
			}

			// A start that keeps reporting (runtime-init taking long) is
			// not timed out. (first and second now score too low for it.)
			w := newWorker(t, b, agentTok, brokertest.H100("us-west-2", 20))
			w.keepAlive(t)
			run2 := submit(t, c, "us-west-2", nil)
			if run2.NodeId != w.ID {
				t.Fatalf("run placed on %q (%s), want the node without failed launches", run2.NodeId, run2.Reason)
			}
			as2 := w.poll(t, 5)
			end := time.Now().Add(2 * cfg.StartTimeout)
			for time.Now().Before(end) {
				if _, err := w.update(as2, gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0); err != nil {
					t.Fatalf("a start that keeps reporting was ended: %v", err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if r := getRun(t, c, run2.Id); r.State != gpupassv1.AllocState_ALLOC_STATE_STARTING {
				t.Errorf("run = %s (%s), want still starting", r.State, r.Reason)
			}
		})
	}
}

// TestNodeFaultFromTheAgent: an agent that says its run failed because of
// the node (a Slurm job ended NODE_FAIL or PREEMPTED; sbatch refused it)
// gets the run handled as for a lost node (re-placed when it may resume
// elsewhere, from where the broker's records end) or failed, and the node's
// failed launch counts in its 24 h failure rate either way.
func TestNodeFaultFromTheAgent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		fault           gpupassv1.NodeFault
		resumeElsewhere bool
		wantState       gpupassv1.AllocState
		wantReason      string
	}{
		{"lost, resumes elsewhere", gpupassv1.NodeFault_NODE_FAULT_LOST, true, gpupassv1.AllocState_ALLOC_STATE_MATCHED, ""},
		{"lost", gpupassv1.NodeFault_NODE_FAULT_LOST, false, gpupassv1.AllocState_ALLOC_STATE_FAILED, "says: slurm job 7 on n1: NODE_FAIL mid-run"},
		{"launch refused", gpupassv1.NodeFault_NODE_FAULT_LAUNCH, false, gpupassv1.AllocState_ALLOC_STATE_FAILED, "slurm job 7 on n1: NODE_FAIL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
			agentTok := b.Token(t, store.RoleAgent, "*")
			first := newWorker(t, b, agentTok, brokertest.H100("eu-central-1", 20))
			second := newWorker(t, b, agentTok, brokertest.H100("eu-central-1", 22))
			first.keepAlive(t)
			second.keepAlive(t)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
			run := submit(t, c, "eu-central-1", func(r *gpupassv1.SubmitRequest) { r.ResumeElsewhere = tc.resumeElsewhere })
			as := first.poll(t, 5)
			if as == nil || run.NodeId != first.ID {
				t.Fatalf("placed on %s, assignment %v", run.NodeId, as)
			}
			if _, err := first.update(as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
				t.Fatal(err)
			}
			if held, err := first.upload(as, records(1, 5)); err != nil || held != 5 {
				t.Fatalf("upload: %d, %v", held, err)
			}
			_, err := first.runs.Work.UpdateAllocation(context.Background(), connect.NewRequest(&gpupassv1.UpdateAllocationRequest{
				AgentId: first.ID, AllocId: as.AllocId, FencingToken: as.FencingToken, State: gpupassv1.AllocState_ALLOC_STATE_FAILED,
				Reason: "slurm job 7 on n1: NODE_FAIL", ExitCode: -1, Attempts: 1, LastSeq: 5, NodeFault: tc.fault}))
			if err != nil {
				t.Fatal(err)
			}
			got := getRun(t, c, run.Id)
			if got.State != tc.wantState || !strings.Contains(got.Reason, tc.wantReason) {
				t.Errorf("run = %s (%q), want %s with %q", got.State, got.Reason, tc.wantState, tc.wantReason)
			}
			if tc.resumeElsewhere {
				if got.NodeId != second.ID || !cmp.Equal(got.ReplacedNodes, []string{first.ID}) {
					t.Errorf("re-placed on %s, replaced %v; want %s, [%s]", got.NodeId, got.ReplacedNodes, second.ID, first.ID)
				}
				as2 := second.poll(t, 5)
				if as2 == nil || as2.AllocId != run.Id || as2.ResumeAfterSeq != 5 {
					t.Errorf("second's assignment = %v, want the run resuming after seq 5", as2)
				}
			}
			nodes, err := b.Clients(t, b.Token(t, store.RoleRead, "*")).Node.ListNodes(context.Background(),
				connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes.Msg.Nodes {
				// One run, launched then failed for its node: one
				// launch, failed (100%), not one of each.
				if n.Id == first.ID && (n.Health.LaunchFailures_24H != 1 || n.Health.Launches_24H != 1) {
					t.Errorf("first's launches in 24 h = %d, %d failed; want 1, 1 failed", n.Health.Launches_24H, n.Health.LaunchFailures_24H)
				}
			}
		})
	}
}
