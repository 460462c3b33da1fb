package runsbench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/loadgen"
)

type stack struct {
	sub *client.RunClients
}

// start runs a SQLite broker, one protocol-level registered node and the
// agent's real run loop on it.
func start(b testing.TB) *stack {
	b.Helper()
	// Capacity, not policy: the chatty run sends far more than the
	// broker's per-run rate limit lets a real run send (quota.go); the
	// agent's own output limits are not set on this executor either.
	cfg := brokertest.Fast()
	cfg.RunMaxRecordsPerSecond = -1
	br := brokertest.Start(b, brokertest.NewDB(b, "sqlite"), cfg)
	tok := br.Token(b, store.RoleAgent, "*")
	node := brokertest.Register(b, br.URL, tok, brokertest.H100("us-bench-1", 20))
	src, err := agent.NewBrokerSource(br.URL, client.Options{Token: tok, Agent: node.Creds}, func() string { return node.ID }, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &agent.RunLoop{Source: src, AgentID: func() string { return node.ID }, StateDir: b.TempDir(),
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}}
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	sub, err := client.DialRuns(br.URL, client.Options{Token: br.Token(b, store.RoleSubmit, "*")})
	if err != nil {
		b.Fatal(err)
	}
	return &stack{sub: sub}
}

func (s *stack) submit(b testing.TB, ctx context.Context, command ...string) *gpupassv1.Run {
	resp, err := s.sub.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: []byte(loadgen.SpecYAML), Region: "us-bench-1", Command: command}))
	if err != nil {
		b.Fatal(err)
	}
	if r := resp.Msg.Run; r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED {
		b.Fatalf("submit: run failed at once: %s", r.Reason)
	}
	return resp.Msg.Run
}

// follow reads the run's events until one satisfies stop (or the run
// ends), returning when it arrived.
func (s *stack) follow(b testing.TB, ctx context.Context, id string, stop func(events.Event) bool) (time.Time, *gpupassv1.Run) {
	st, err := s.sub.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: id, Follow: true}))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for st.Receive() {
		for _, r := range st.Msg().Records {
			var ev events.Event
			if err := json.Unmarshal(r.Data, &ev); err != nil {
				b.Fatal(err)
			}
			if stop != nil && stop(ev) {
				return time.Now(), nil
			}
		}
		if fin := st.Msg().Run; fin != nil {
			return time.Now(), fin
		}
	}
	b.Fatalf("log stream of %s: %v", id, st.Err())
	return time.Time{}, nil
}

// BenchmarkSubmitToFirstLine: Submit of `echo hello` until its first
// output line reaches a client following the run's logs, through the
// broker's placement, the agent's long poll, the executor, the spool, the
// uploader and the store. Reports p50/p95 in ms over b.N runs.
func BenchmarkSubmitToFirstLine(b *testing.B) {
	s := start(b)
	ctx := context.Background()
	lat := make([]float64, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		r := s.submit(b, ctx, "echo", "hello")
		at, fin := s.follow(b, ctx, r.Id, func(ev events.Event) bool { return ev.Message == "hello" })
		if fin != nil {
			b.Fatalf("%s ended (%s: %s) before its first line reached the client", r.Id, fin.State, fin.Reason)
		}
		lat = append(lat, float64(at.Sub(t0).Microseconds())/1000)
		// The next run waits for this one to end: one node, one run.
		s.follow(b, ctx, r.Id, nil)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(lat[len(lat)/2], "p50-ms")
	b.ReportMetric(lat[min(len(lat)-1, len(lat)*95/100)], "p95-ms")
}

// BenchmarkChattyEndToEnd: a command printing b.N lines, from Submit
// until the broker holds every record (the final state comes after the
// drain). Reports events/s into the SQLite store.
func BenchmarkChattyEndToEnd(b *testing.B) {
	s := start(b)
	ctx := context.Background()
	n := max(b.N, 1000)
	b.ResetTimer()
	t0 := time.Now()
	r := s.submit(b, ctx, "sh", "-c", fmt.Sprintf("seq 1 %d", n))
	_, fin := s.follow(b, ctx, r.Id, nil)
	el := time.Since(t0)
	b.StopTimer()
	if fin.HeldThrough < uint64(n) {
		for i := 0; i < 50; i++ {
			g, err := s.sub.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: r.Id}))
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("after %d00ms: held_through %d, state %s", i, g.Msg.Run.HeldThrough, g.Msg.Run.State)
			if g.Msg.Run.HeldThrough >= uint64(n) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if fin.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || fin.HeldThrough < uint64(n) {
		b.Fatalf("run %s: %s (%s), %d records held, want >= %d", r.Id, fin.State, fin.Reason, fin.HeldThrough, n)
	}
	b.ReportMetric(float64(fin.HeldThrough)/el.Seconds(), "events/s")
}

// TestChattyRunHoldsEverything is the regression test for a run that
// ended "succeeded" while the broker held only part of its log: the
// background uploader and the final drain raced on one spool. Every line
// of a chatty command must be held, gap-free, by the time the final state
// is visible.
func TestChattyRunHoldsEverything(t *testing.T) {
	s := start(t)
	ctx := context.Background()
	const n = 50000
	r := s.submit(t, ctx, "sh", "-c", fmt.Sprintf("seq 1 %d", n))
	_, fin := s.follow(t, ctx, r.Id, nil)
	if fin == nil {
		t.Fatalf("run %s: no final state", r.Id)
	}
	if fin.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || fin.HeldThrough < n {
		t.Fatalf("run %s: %s (%s) with %d records held, want succeeded with >= %d", r.Id, fin.State, fin.Reason, fin.HeldThrough, n)
	}
}
