package brokertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
)

// Lease is a run held by an API-level agent, as gpupass-agent would hold
// it after starting it: placed, STARTING, its run report signed and
// accepted, RUNNING. Tests of what the broker and the CLI make of a run's
// records drive it from there (Upload, Update).
type Lease struct {
	Agent      *Agent
	Work       *client.RunClients // the agent's, proving its identity
	Run        *gpupassv1.Run
	Assignment *gpupassv1.Assignment
	SpecYAML   []byte // the spec submitted
	// Submitter is the client that submitted the run: its token may add
	// runs to the run's group.
	Submitter *client.RunClients
	tb        testing.TB
}

// StartRun registers an H100 agent in region, submits the spec
// broker/testdata/h100.yaml there with a submit token for region, and
// takes the run to RUNNING with a signed run report.
func StartRun(tb testing.TB, b *Broker, region string) *Lease {
	tb.Helper()
	submitter, err := client.DialRuns(b.URL, client.Options{Token: b.Token(tb, store.RoleSubmit, region)})
	if err != nil {
		tb.Fatal(err)
	}
	return startRun(tb, b, submitter, region, "", 1)
}

// StartGroup is StartRun for each region in one run group, as gpupass
// train submits several regions: one submit token for all of them, the
// first run drawing the group and the others joining it.
func StartGroup(tb testing.TB, b *Broker, regions ...string) []*Lease {
	tb.Helper()
	submitter, err := client.DialRuns(b.URL, client.Options{Token: b.Token(tb, store.RoleSubmit, regions...)})
	if err != nil {
		tb.Fatal(err)
	}
	var ls []*Lease
	group := ""
	for _, r := range regions {
		l := startRun(tb, b, submitter, r, group, int32(len(regions)))
		group = l.Run.Group
		ls = append(ls, l)
	}
	return ls
}

func startRun(tb testing.TB, b *Broker, submitter *client.RunClients, region, group string, groupSize int32) *Lease {
	tb.Helper()
	ctx := context.Background()
	agentTok := b.Token(tb, store.RoleAgent, "*")
	ag := Register(tb, b.URL, agentTok, H100(region, 20))
	work := ag.Runs(tb, b.URL, agentTok)
	specYAML, err := os.ReadFile(filepath.Join(testutil.RepoRoot(tb), "broker", "testdata", "h100.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	sub, err := submitter.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: specYAML, Region: region, Command: []string{"python3", "train.py"},
		Group: group, GroupSize: groupSize}))
	if err != nil {
		tb.Fatal(err)
	}
	run := sub.Msg.Run
	pw, err := work.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: ag.ID, WaitSeconds: 5}))
	if err != nil || pw.Msg.Assignment.GetAllocId() != run.Id {
		tb.Fatalf("PollWork = %v, %v; want the assignment of %s", pw, err, run.Id)
	}
	l := &Lease{Agent: ag, Work: work, Run: run, Assignment: pw.Msg.Assignment, SpecYAML: specYAML, Submitter: submitter, tb: tb}
	l.Update(gpupassv1.AllocState_ALLOC_STATE_STARTING, 0)
	rep := ag.Report()
	rep.AllocationID, rep.SpecFingerprint, rep.RuntimeFingerprint = run.Id, run.SpecFingerprint, run.SpecFingerprint
	rb, sig, err := Sign(ag.Key, rep)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := work.Work.SubmitRunReport(ctx, connect.NewRequest(&gpupassv1.SubmitRunReportRequest{AgentId: ag.ID, AllocId: run.Id,
		FencingToken: l.Assignment.FencingToken, Report: rb, Signature: sig})); err != nil {
		tb.Fatalf("SubmitRunReport: %v", err)
	}
	l.Update(gpupassv1.AllocState_ALLOC_STATE_RUNNING, 0)
	return l
}

// Update reports the run's state under the lease, with lastSeq the
// highest seq the agent sent; a refusal fails the test.
func (l *Lease) Update(st gpupassv1.AllocState, lastSeq uint64) {
	l.tb.Helper()
	if _, err := l.Work.Work.UpdateAllocation(context.Background(), connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: l.Agent.ID,
		AllocId: l.Run.Id, FencingToken: l.Assignment.FencingToken, State: st, Attempts: 1, LastSeq: lastSeq})); err != nil {
		l.tb.Fatalf("update %v: %v", st, err)
	}
}

// Upload sends recs under the lease and returns the broker's answer.
func (l *Lease) Upload(recs ...*gpupassv1.Record) (*gpupassv1.UploadRecordsResponse, error) {
	resp, err := l.Work.Work.UploadRecords(context.Background(), connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: l.Agent.ID,
		AllocId: l.Run.Id, FencingToken: l.Assignment.FencingToken, Records: recs}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// MetricRecord is a metric record at seq for step (attempt 1) holding
// values as JSON numbers, e.g. `"loss":0.5`.
func MetricRecord(seq uint64, step int, values string) *gpupassv1.Record {
	return &gpupassv1.Record{Seq: seq, Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC,
		Data: fmt.Appendf(nil, `{"step":%d,"ts":"2026-11-29T12:00:%02dZ","attempt":1,"values":{%s}}`, step, step%60, values)}
}
