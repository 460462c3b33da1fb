package loadgen_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/loadgen"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

// TestMain doubles as the runs' job: "<test binary> emit RATE COUNT
// [METRICS_RATE]" prints the lines and writes the metric points, as
// gpupass-loadgen's emit subcommand does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "emit" {
		if err := loadgen.EmitMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(pgtest.Run(m))
}

// TestLoadAgainstOneBroker runs a small fleet against one real broker on
// PostgreSQL: every agent enrolls, reports and beats; every run streams
// all its lines and writes metric points to the executor's metrics file,
// and reading them back from the broker finds each line and point exactly
// once. Counts only, never timings.
func TestLoadAgainstOneBroker(t *testing.T) {
	t.Setenv("GPUPASS_RUN_LOG_LINES_PER_SECOND", "-1")
	t.Setenv("GPUPASS_RUN_MAX_RECORDS_PER_SECOND", "-1")
	cfg := brokertest.Fast()
	cfg.RunMaxRecordsPerSecond = -1
	br := brokertest.Start(t, brokertest.NewDB(t, "postgres"), cfg)
	// 300 lines at 1,000/s with 100 points/s: 30 points a run.
	const agents, runs, lines, points = 20, 4, 300, 30
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := loadgen.Run(ctx, loadgen.Config{
		BrokerURLs: []string{br.URL}, AgentToken: br.Token(t, store.RoleAgent, "*"),
		SubmitToken: br.Token(t, store.RoleSubmit, "*"), ReadToken: br.Token(t, store.RoleRead, "*"),
		Agents: agents, Runs: runs, Lines: lines, LinesPerSecond: 1000, MetricsPerSecond: 100,
		HeartbeatEvery: 200 * time.Millisecond, Duration: 2 * time.Second, Submitters: 1, DryRunEvery: 200 * time.Millisecond,
		Emitter: []string{os.Args[0], "emit"}, ClientsPerBroker: 2, StateDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *res)
	if res.RunsSucceeded != runs || len(res.RunsFailed) != 0 {
		t.Errorf("runs: %d succeeded, failed %q; want all %d succeeded", res.RunsSucceeded, res.RunsFailed, runs)
	}
	if res.LinesEmitted != runs*lines || res.LinesStored != runs*lines || res.LinesLost != 0 || res.LinesDuplicated != 0 {
		t.Errorf("lines: %d emitted, %d stored, %d lost, %d duplicated; want %d stored, none lost or duplicated",
			res.LinesEmitted, res.LinesStored, res.LinesLost, res.LinesDuplicated, runs*lines)
	}
	if res.MetricsEmitted != runs*points || res.MetricsStored != runs*points || res.MetricsLost != 0 || res.MetricsDuplicated != 0 {
		t.Errorf("metric points: %d emitted, %d stored, %d lost, %d duplicated; want %d stored, none lost or duplicated",
			res.MetricsEmitted, res.MetricsStored, res.MetricsLost, res.MetricsDuplicated, runs*points)
	}
	if res.LineLatency.N != runs*lines {
		t.Errorf("the followers timed %d lines, want every one of %d", res.LineLatency.N, runs*lines)
	}
	if res.HeartbeatErrors != 0 || res.Heartbeats.N < agents+runs {
		t.Errorf("heartbeats: %d measured, %d errors; want at least one per agent (%d) and no error", res.Heartbeats.N, res.HeartbeatErrors, agents+runs)
	}
	// The store itself: every agent with its simulated report, and each
	// run's events once per seq, gap-free, its lines among them.
	nodes, err := br.Store.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	reported := 0
	for _, n := range nodes {
		if n.HasReport && n.Index.Simulated {
			reported++
		}
	}
	if len(nodes) != agents+runs || reported != agents+runs {
		t.Errorf("store holds %d nodes, %d with a simulated report; want %d of each", len(nodes), reported, agents+runs)
	}
	rs, ok := br.Store.(store.Runs)
	if !ok {
		t.Fatalf("%T keeps no runs", br.Store)
	}
	for _, id := range res.RunIDs {
		recs, err := rs.Records(context.Background(), id, 0, store.RecordEvent, 100000)
		if err != nil {
			t.Fatal(err)
		}
		stored := 0
		for i, r := range recs {
			if i > 0 && r.Seq <= recs[i-1].Seq {
				t.Fatalf("run %s: store returned seq %d after %d", id, r.Seq, recs[i-1].Seq)
			}
			if bytes.Contains(r.Data, []byte(`"msg":"gpl `)) {
				stored++
			}
		}
		if stored != lines {
			t.Errorf("run %s: the store holds %d of its %d lines", id, stored, lines)
		}
		// Its metric points, read from the metrics file by the
		// executor: each step once.
		mrecs, err := rs.Records(context.Background(), id, 0, store.RecordMetric, 100000)
		if err != nil {
			t.Fatal(err)
		}
		steps := map[int64]int{}
		for _, r := range mrecs {
			var m events.Metric
			if err := json.Unmarshal(r.Data, &m); err != nil {
				t.Fatalf("run %s: metric record %d: %v", id, r.Seq, err)
			}
			if m.Source != "file" {
				t.Errorf("run %s: metric step %d came from %q, want the metrics file", id, m.Step, m.Source)
			}
			steps[m.Step]++
		}
		var wrong []string
		for s := int64(0); s < points; s++ {
			if steps[s] != 1 {
				wrong = append(wrong, fmt.Sprintf("step %d %d times", s, steps[s]))
			}
		}
		if len(wrong) > 0 || len(steps) != points {
			t.Errorf("run %s: the store holds %d distinct metric steps, want %d each once; wrong: %v", id, len(steps), points, wrong[:min(len(wrong), 5)])
		}
	}
	// Each dry-run judged every node (how many are candidates depends on
	// the RTTs the beats measured, so on the machine's load).
	if res.DryRunErrors != 0 || res.DryRuns.N == 0 || res.DryRunNodes != agents+runs {
		t.Errorf("dry-runs: %d measured, %d errors, %d nodes judged; want some, no error, %d nodes", res.DryRuns.N, res.DryRunErrors, res.DryRunNodes, agents+runs)
	}
}

// TestRunsWaitUntilTheBrokerSeesTheirAgents: the broker fails a run at once
// when its region has no live node, so the runs must not be submitted
// before their runner agents' first heartbeats. With a long heartbeat
// interval, spreading the runners' first beats over it (as the idle
// fleet's are) put them seconds after the submission: the run failed
// with "never sent a heartbeat" (seen at GPUPASS_BENCH_FLEET_SCALE=0.005).
// Two brokers on one PostgreSQL, the runner agent on the one the runs
// are not submitted to: its report, beats and work polls tell only its
// own broker that it is alive at once; the submitting broker learns it
// from the store, after the runner's broker has written its buffered
// beats (every 2 s here; 250 ms by default). Without the wait for that,
// the run failed with "never sent a heartbeat".
func TestRunsWaitUntilTheBrokerSeesTheirAgents(t *testing.T) {
	t.Setenv("GPUPASS_RUN_LOG_LINES_PER_SECOND", "-1")
	db := brokertest.NewDB(t, "postgres")
	slow := brokertest.Fast()
	slow.FlushInterval = 2 * time.Second
	b0, b1 := brokertest.Start(t, db, brokertest.Fast()), brokertest.Start(t, db, slow)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Agent i talks to broker i mod 2: the runner, agent 9, to b1.
	res, err := loadgen.Run(ctx, loadgen.Config{
		BrokerURLs: []string{b0.URL, b1.URL}, AgentToken: b0.Token(t, store.RoleAgent, "*"),
		SubmitToken: b0.Token(t, store.RoleSubmit, "*"), ReadToken: b0.Token(t, store.RoleRead, "*"),
		Agents: 9, Runs: 1, Lines: 20, LinesPerSecond: 100,
		HeartbeatEvery: 4 * time.Second, Duration: time.Second,
		Emitter: []string{os.Args[0], "emit"}, ClientsPerBroker: 1, StateDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.RunsSucceeded != 1 || len(res.RunsFailed) != 0 || res.LinesStored != 20 {
		t.Errorf("runs: %d succeeded, failed %q, %d of 20 lines stored; want the run to succeed whole", res.RunsSucceeded, res.RunsFailed, res.LinesStored)
	}
}
