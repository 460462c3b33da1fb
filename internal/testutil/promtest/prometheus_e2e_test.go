//go:build e2e

package promtest_test

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
	"github.com/gpupass/gpupass/internal/testutil/promtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestPrometheusScrapesStack: a real Prometheus scrapes a real broker
// (`gpupass up`, /metrics behind --metrics-token-file, sent by Prometheus
// from authorization.credentials_file) and a real agent's query endpoint
// while a run logs; PromQL over the HTTP API then counts the certified
// nodes the broker lists and the records the run's log holds.
func TestPrometheusScrapesStack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	secretFile := filepath.Join(t.TempDir(), "metrics-token")
	if err := os.WriteFile(secretFile, []byte("prom-e2e-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"},
		Env: []string{"GPUPASS_METRICS_TOKEN_FILE=" + secretFile,
			"GPUPASS_RUN_LOG_LINES_PER_SECOND=-1", "GPUPASS_RUN_MAX_RECORDS_PER_SECOND=-1"}})
	cfg := stack.Config(t)
	addrFile := filepath.Join(t.TempDir(), "agent-addr")
	stack.StartAgent(t, "prom-agent", "us-west-2", "--addr-file", addrFile)
	var agentURL string
	upstack.WaitFor(t, ctx, "the agent's query endpoint", func() bool {
		b, err := os.ReadFile(addrFile)
		agentURL = strings.TrimSpace(string(b))
		return err == nil && agentURL != ""
	})
	hostport := func(u string) string { return strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://") }
	prom := promtest.StartPrometheus(t, fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: gpupass-broker
    authorization:
      credentials_file: %s
    static_configs:
      - targets: [%q]
  - job_name: gpupass-agent
    static_configs:
      - targets: [%q]
`, secretFile, hostport(cfg.BrokerURL), hostport(agentURL)))

	query := func(q string) (float64, bool) {
		v, ok, err := prom.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return v, ok
	}
	upstack.WaitFor(t, ctx, "both targets up in Prometheus", func() bool {
		v, ok := query(`sum(up{job=~"gpupass-broker|gpupass-agent"})`)
		return ok && v == 2
	})

	// A run that logs for a few seconds, so scrapes land during it.
	out, err := stack.Command(ctx, "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--name", "prom",
		"--follow", "--", "sh", "-c", "for i in $(seq 1 30); do echo step $i; sleep 0.1; done").CombinedOutput()
	if err != nil {
		t.Fatalf("train --follow: %v\n%s", err, out)
	}
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil || len(runs.Msg.Runs) != 1 {
		t.Fatalf("listing runs: %v (%d runs)", err, len(runs.Msg.GetRuns()))
	}
	run := runs.Msg.Runs[0]
	if run.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || !run.LogComplete {
		t.Fatalf("run %s: %s, log complete %t; want a succeeded run with its whole log", run.Id, run.State, run.LogComplete)
	}
	nc, err := client.Dial(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := nc.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
	if err != nil {
		t.Fatal(err)
	}
	certified := 0
	for _, n := range nodes.Msg.Nodes {
		if n.ConformancePassed {
			certified++
		}
	}
	if certified < 2 {
		t.Fatalf("the broker lists %d certified nodes, want the stack's and the test's agent", certified)
	}

	// Every record of the run was ingested once: the sum over kinds is
	// its last seq; its log events are among them.
	var nodesSeen, ingested float64
	defer func() {
		if t.Failed() {
			t.Logf("PromQL last answered %v certified nodes (broker lists %d) and %v records ingested (run's last seq %d)", nodesSeen, certified, ingested, run.LastSeq)
		}
	}()
	upstack.WaitFor(t, ctx, "Prometheus to hold the certified nodes and the run's records", func() bool {
		nodesSeen, _ = query(`sum(gpupass_broker_nodes{certified="true"})`)
		ingested, _ = query(`sum(gpupass_broker_records_ingested_total)`)
		return nodesSeen == float64(certified) && ingested == float64(run.LastSeq)
	})
	events, ok := query(`sum(increase(gpupass_broker_records_ingested_total{kind="event"}[5m]))`)
	if !ok || events < 30 {
		t.Errorf("events ingested during the run per PromQL = %v (found %t), want at least the 30 lines it logged", events, ok)
	}
	// The agent was scraped: its run state and NVML status are in the TSDB
	// (NVML is absent here: reported, not failed).
	if v, ok := query(`count(gpupass_agent_run_state)`); !ok || v != 3 {
		t.Errorf("count(gpupass_agent_run_state) = %v (found %t), want its 3 states", v, ok)
	}
	if _, ok := query(`gpupass_agent_nvml_up`); !ok {
		t.Error("gpupass_agent_nvml_up not scraped from the agent")
	}
	t.Logf("PromQL: %v certified nodes, %v records ingested (%v log events) for run %s (last seq %d)", nodesSeen, ingested, events, run.Id, run.LastSeq)
}
