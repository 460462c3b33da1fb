package gpupass_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// protocolAgent registers n and, until the test ends, polls for work over
// the real agent protocol and hands each assignment to work.
func protocolAgent(t *testing.T, url, tok string, n brokertest.NodeSpec, work func(ctx context.Context, c *client.RunClients, agentID string, as *gpupassv1.Assignment)) {
	t.Helper()
	a := brokertest.Register(t, url, tok, n)
	c, err := client.DialRuns(url, client.Options{Token: tok, GRPC: true, Agent: a.Creds})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			resp, err := c.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: a.ID, WaitSeconds: 1}))
			if err == nil && resp.Msg.Assignment != nil {
				work(ctx, c, a.ID, resp.Msg.Assignment)
			}
		}
	}()
}

// fakeAgent works assignments over the real run protocol: it reports
// starting and running, uploads events and loss points (twice, as after
// a lost reply) and ends the run as outcome says for its region.
func fakeAgent(t *testing.T, url, tok string, n brokertest.NodeSpec, fail bool) {
	t.Helper()
	protocolAgent(t, url, tok, n, func(ctx context.Context, c *client.RunClients, agentID string, as *gpupassv1.Assignment) {
		update := func(st gpupassv1.AllocState, reason string, code int32, last uint64) {
			_, _ = c.Work.UpdateAllocation(ctx, connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: agentID, AllocId: as.AllocId,
				FencingToken: as.FencingToken, State: st, Reason: reason, ExitCode: code, Attempts: 1, LastSeq: last}))
		}
		update(gpupassv1.AllocState_ALLOC_STATE_STARTING, "", 0, 0)
		update(gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0, 0)
		var recs []*gpupassv1.Record
		seq := uint64(0)
		for step := 1; step <= 5; step++ {
			seq++
			recs = append(recs, &gpupassv1.Record{Seq: seq, Kind: gpupassv1.RecordKind_RECORD_KIND_EVENT,
				Data: fmt.Appendf(nil, `{"ts":"2026-11-29T12:00:0%d.125Z","level":"INFO","component":"trainer","msg":"step %d in %s"}`, step, step, n.Region)})
			seq++
			recs = append(recs, &gpupassv1.Record{Seq: seq, Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC,
				Data: fmt.Appendf(nil, `{"step":%d,"ts":"2026-11-29T12:00:0%dZ","attempt":1,"values":{"loss":%g}}`, step, step, 2.0/float64(step))})
		}
		for i := 0; i < 2; i++ {
			_, _ = c.Work.UploadRecords(ctx, connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: agentID, AllocId: as.AllocId,
				FencingToken: as.FencingToken, Records: recs}))
		}
		if fail {
			update(gpupassv1.AllocState_ALLOC_STATE_FAILED, "command exited with code 3", 3, seq)
		} else {
			update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, "", 0, seq)
		}
	})
}

// runsBroker serves three nodes. The train calls pass --min-health-score 0:
// these tests are about runs, and under load the heartbeat latency term
// can push the pricier eu node below the default 85.
func runsBroker(t *testing.T, failEU bool) (url, submit string) {
	t.Helper()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleAgent, "*")
	fakeAgent(t, b.URL, tok, brokertest.H100("us-west-2", 20), false)
	fakeAgent(t, b.URL, tok, brokertest.H100("eu-central-1", 22), failEU)
	// A node that never takes work: runs placed there stay matched.
	brokertest.Register(t, b.URL, tok, brokertest.H100("ap-south-1", 20))
	return b.URL, b.Token(t, store.RoleSubmit, "*")
}

var allocRE = regexp.MustCompile(`alloc-[0-9a-f]{8}`)

func TestTrainFollowLogsRunsCompare(t *testing.T) {
	t.Parallel()
	url, tok := runsBroker(t, false)
	spec := writeH100Spec(t)
	broker := []string{"--broker-url", url, "--broker-token", tok}

	args := append([]string{"train", "--spec", spec, "--min-health-score", "0", "--region", "us-west-2", "--region", "eu-central-1", "--name", "bert", "--follow"}, broker...)
	code, out, errOut := runMain(t, append(args, "--", "python3", "train.py")...)
	if code != 0 {
		t.Fatalf("train exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"us-west-2 | [2026-11-29 12:00:01.125] INFO trainer step 1 in us-west-2",
		"eu-central-1 | [2026-11-29 12:00:05.125] INFO trainer step 5 in eu-central-1",
		"bert-us-west-2", "bert-eu-central-1", "succeeded",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("train output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "step 3 in us-west-2"); n != 1 {
		t.Errorf("step 3 of us-west-2 printed %d times, want once (records uploaded twice are stored once)", n)
	}
	ids := allocRE.FindAllString(out, -1)
	if len(ids) < 2 || ids[0] == ids[1] {
		t.Fatalf("alloc ids in output: %v", ids)
	}
	us, eu := ids[0], ids[1]

	code, out, _ = runMain(t, append([]string{"runs", "-o", "json"}, broker...)...)
	var list struct {
		Runs []struct {
			ID     string `json:"id"`
			Region string `json:"region"`
			State  string `json:"state"`
			NodeID string `json:"node_id"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Runs) != 2 {
		t.Fatalf("runs -o json: exit %d, %v:\n%s", code, err, out)
	}
	for _, r := range list.Runs {
		if r.State != "succeeded" || r.NodeID == "" {
			t.Errorf("listed run %+v", r)
		}
	}

	code, out, _ = runMain(t, append([]string{"logs", us, "-o", "json"}, broker...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 5 {
		t.Fatalf("logs -o json: exit %d, %d lines:\n%s", code, len(lines), out)
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &ev); err != nil || ev["msg"] != "step 1 in us-west-2" || ev["seq"] != 1.0 || ev["region"] != "us-west-2" {
		t.Errorf("first JSON event = %v, %v", ev, err)
	}
	code, out, _ = runMain(t, append([]string{"logs", eu, "--metrics", "--follow"}, broker...)...)
	if code != 0 || strings.Count(out, "METRIC step=") != 5 || strings.Count(out, "INFO trainer") != 5 {
		t.Errorf("logs --metrics --follow: exit %d:\n%s", code, out)
	}

	code, out, errOut = runMain(t, append([]string{"compare", us, eu, "--post", "none", "-o", "json"}, broker...)...)
	if code != 0 || !strings.Contains(out, `"us-west-2"`) || !strings.Contains(out, `"eu-central-1"`) {
		t.Errorf("compare of two allocations: exit %d\n%s\n%s", code, out, errOut)
	}
}

func TestTrainWorstResultAndCancel(t *testing.T) {
	t.Parallel()
	url, tok := runsBroker(t, true)
	spec := writeH100Spec(t)
	broker := []string{"--broker-url", url, "--broker-token", tok}

	args := append([]string{"train", "--spec", spec, "--min-health-score", "0", "--region", "us-west-2", "--region", "eu-central-1", "--follow"}, broker...)
	code, out, errOut := runMain(t, append(args, "--", "python3", "train.py")...)
	if code != 1 || !strings.Contains(errOut, "1 of 2 runs did not succeed") || !strings.Contains(errOut, "command exited with code 3") {
		t.Errorf("train with a failing region: exit %d\n%s\n%s", code, out, errOut)
	}

	// Placed on the node that never takes work, then cancelled.
	code, out, _ = runMain(t, append(append([]string{"train", "--spec", spec, "--min-health-score", "0", "--region", "ap-south-1"}, broker...), "--", "true")...)
	id := allocRE.FindString(out)
	if code != 0 || id == "" || !strings.Contains(out, "matched") {
		t.Fatalf("train in ap-south-1: exit %d\n%s", code, out)
	}
	code, out, _ = runMain(t, append([]string{"cancel", id}, broker...)...)
	if code != 0 || out != id+" cancelled by user\n" {
		t.Errorf("cancel: exit %d %q", code, out)
	}
	code, _, errOut = runMain(t, append([]string{"logs", id, "--follow"}, broker...)...)
	if code != 1 || !strings.Contains(errOut, "cancelled") {
		t.Errorf("logs --follow of a cancelled run: exit %d %s", code, errOut)
	}

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no region", []string{"train", "--spec", spec, "--", "true"}, "no region"},
		{"no command", []string{"train", "--spec", spec, "--region", "us-west-2"}, "no command"},
		{"command without --", []string{"train", "--spec", spec, "--region", "us-west-2", "python3"}, "after --"},
		{"region twice", []string{"train", "--spec", spec, "--region", "us-west-2", "--region", "us-west-2", "--", "true"}, "given twice"},
		{"missing spec", []string{"train", "--spec", "/nonexistent.yaml", "--region", "us-west-2", "--", "true"}, "no nonexistent.yaml in /: run `gpupass init`"},
		{"unknown alloc", []string{"logs", "alloc-00000000"}, "not found"},
	}
	for _, tt := range tests {
		code, _, errOut := runMain(t, append(tt.args, broker...)...)
		if code != 2 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", tt.name, code, errOut, tt.want)
		}
	}
}
