package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
)

// TestFailedChecksNamed: a node whose report fails a check (a Slurm node
// an admin drained) is excluded from dry-run with the check's own
// message, and nodes lists it; what a report can make the broker keep
// and show is bounded.
func TestFailedChecksNamed(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	a := brokertest.Register(t, b.URL, b.Token(t, store.RoleAgent, "*"), brokertest.H100("hpc-eu", 20))
	c := b.Clients(t, b.Token(t, store.RoleRead, "*"))
	ctx := context.Background()

	upload := func(checks ...conformance.Check) {
		t.Helper()
		r := a.Report()
		r.Checks = append(r.Checks, checks...)
		if err := a.Upload(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	drain := conformance.Check{Name: "slurm.node", Expected: "available to jobs", Actual: "n1 on cluster gptest, state IDLE+DRAIN",
		Status: conformance.Fail, Message: "slurm node n1 is drain: fan"}
	upload(drain)
	resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := api.ExpandDryRun(resp.Msg); err != nil { // the default view refers to a reason table
		t.Fatal(err)
	}
	if len(resp.Msg.Excluded) != 1 {
		t.Fatalf("excluded %d nodes, want the drained one (candidates %d)", len(resp.Msg.Excluded), len(resp.Msg.Candidates))
	}
	var got []string
	for _, r := range resp.Msg.Excluded[0].Reasons {
		got = append(got, r.Code+":"+r.Field+":"+r.Message)
	}
	if diff := cmp.Diff([]string{"conformance_failed:slurm.node:failed check slurm.node: slurm node n1 is drain: fan"}, got); diff != "" {
		t.Errorf("dry-run reasons (-want +got):\n%s", diff)
	}
	nodes, err := c.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Msg.Nodes) != 1 || !cmp.Equal(nodes.Msg.Nodes[0].FailedChecks, []string{"slurm.node: slurm node n1 is drain: fan"}) {
		t.Errorf("nodes = %v, want the drain reason in failed_checks", nodes.Msg.Nodes)
	}

	// Six failures, one with a 1000-byte message: four kept, each cut
	// to 300 bytes, then a marker.
	var many []conformance.Check
	for i := range 6 {
		many = append(many, conformance.Check{Name: fmt.Sprintf("c%d", i), Status: conformance.Fail, Message: strings.Repeat("é", 500)})
	}
	upload(many...)
	nodes, err = c.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
	if err != nil {
		t.Fatal(err)
	}
	fc := nodes.Msg.Nodes[0].FailedChecks
	if len(fc) != 5 || fc[4] != "…and more failed checks" {
		t.Fatalf("failed_checks = %d entries %q, want 4 and a marker", len(fc), fc)
	}
	for _, f := range fc {
		if len(f) > 300 || !strings.HasSuffix(f, "…") && f != fc[4] {
			t.Errorf("entry of %d bytes, want at most 300 and marked cut: %.40q", len(f), f)
		}
	}
}

// TestGresCount: a spec needing more GPUs than a Slurm node's GRES gives
// a job is not placed there, whatever the node measured, and dry-run
// says GRES; a node whose GRES covers the count stays a candidate.
func TestGresCount(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleAgent, "*")
	c := b.Clients(t, b.Token(t, store.RoleRead, "*"))
	ctx := context.Background()
	name := map[string]string{}
	for _, tc := range []struct{ name, gres string }{{"gres4", "4"}, {"gres8", "8"}} {
		a := brokertest.Register(t, b.URL, tok, brokertest.H100("hpc-eu", 20)) // measures 8 GPUs
		r := a.Report()
		r.Checks = append(r.Checks, conformance.Check{Name: "slurm.gres", Expected: tc.gres, Actual: tc.gres, Status: conformance.Pass})
		if err := a.Upload(ctx, r); err != nil {
			t.Fatal(err)
		}
		name[a.ID] = tc.name
	}
	resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}})) // count: 8
	if err != nil {
		t.Fatal(err)
	}
	if err := api.ExpandDryRun(resp.Msg); err != nil { // the default view refers to a reason table
		t.Fatal(err)
	}
	if len(resp.Msg.Candidates) != 1 || name[resp.Msg.Candidates[0].Node.Id] != "gres8" {
		t.Errorf("candidates %v, want only gres8", resp.Msg.Candidates)
	}
	if len(resp.Msg.Excluded) != 1 || name[resp.Msg.Excluded[0].Node.Id] != "gres4" {
		t.Fatalf("excluded %v, want gres4", resp.Msg.Excluded)
	}
	r := resp.Msg.Excluded[0].Reasons[0]
	if r.Field != "resources.count" || r.Measured != "gres 4" || !strings.Contains(r.Message, "GRES gives a job 4") {
		t.Errorf("reason %v, want resources.count naming the GRES", r)
	}
}
