package broker_test

import (
	"context"
	"slices"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
)

// TestListNodesSpecFingerprint: ListNodes' spec_fingerprint keeps the
// nodes certified for that spec (a passed report, the spec's runtime),
// whatever their resources, pages through them, and resolves the spec
// only from what the caller could know: its own runs' regions or a dry
// run.
func TestListNodesSpecFingerprint(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	ctx := context.Background()
	agentTok := b.Token(t, store.RoleAgent, "*")
	ok1 := brokertest.Register(t, b.URL, agentTok, brokertest.H100("us-west-2", 10))
	small := brokertest.H100("us-west-2", 9)
	small.Count = 1 // resources are not certification
	ok2 := brokertest.Register(t, b.URL, agentTok, small)
	other := brokertest.H100("us-west-2", 11)
	other.PyTorch = "2.2.0+cu121"
	brokertest.Register(t, b.URL, agentTok, other)
	failed := brokertest.Register(t, b.URL, agentTok, brokertest.H100("us-west-2", 12))
	r := failed.Report()
	r.Checks = append(r.Checks, conformance.Check{Name: "gpu.ecc", Status: conformance.Fail, Message: "uncorrectable ECC errors"})
	if err := failed.Upload(ctx, r); err != nil {
		t.Fatal(err)
	}

	// The spec is known from a run in eu-central-1 only.
	runs, err := client.DialRuns(b.URL, client.Options{Token: b.Token(t, store.RoleSubmit, "*")})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := runs.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: specYAML(t), Region: "eu-central-1", Command: []string{"true"}}))
	if err != nil {
		t.Fatal(err)
	}
	fp := sub.Msg.Run.SpecFingerprint
	list := func(tok string, m *gpupassv1.ListNodesRequest) (*gpupassv1.ListNodesResponse, error) {
		resp, err := b.Clients(t, tok).Node.ListNodes(ctx, connect.NewRequest(m))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}

	us := b.Token(t, store.RoleRead, "us-*")
	if _, err := list(us, &gpupassv1.ListNodesRequest{SpecFingerprint: fp}); brokertest.Code(err) != connect.CodeFailedPrecondition {
		t.Errorf("a us-only reader filtering by the spec of an eu run: %v, want failed_precondition", err)
	}
	if _, err := list(us, &gpupassv1.ListNodesRequest{SpecFingerprint: "sha256:12.1.105"}); brokertest.Code(err) != connect.CodeInvalidArgument {
		t.Errorf("a runtime-shaped fingerprint as the spec's: %v, want invalid_argument", err)
	}

	// Any token in scope of the run finds it, one node a page.
	all := b.Token(t, store.RoleRead, "*")
	var got []string
	m := &gpupassv1.ListNodesRequest{SpecFingerprint: fp, PageSize: 1}
	for page := 0; ; page++ {
		resp, err := list(all, m)
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		if resp.TotalSize != 2 {
			t.Errorf("page %d: total_size %d, want 2", page, resp.TotalSize)
		}
		for _, n := range resp.Nodes {
			got = append(got, n.Id)
		}
		if resp.NextPageToken == "" || page > 3 {
			break
		}
		m.PageToken = resp.NextPageToken
	}
	want := []string{ok1.ID, ok2.ID}
	slices.Sort(want)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("nodes certified for the spec (-want +got):\n%s", d)
	}

	// A page token is bound to the filter.
	first, err := list(all, &gpupassv1.ListNodesRequest{SpecFingerprint: fp, PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := list(all, &gpupassv1.ListNodesRequest{PageSize: 1, PageToken: first.NextPageToken}); brokertest.Code(err) != connect.CodeInvalidArgument {
		t.Errorf("the spec filter's page token without the filter: %v, want invalid_argument", err)
	}

	// A dry run makes its spec known to the us-only reader too.
	if _, err := b.Clients(t, us).Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{
		Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}})); err != nil {
		t.Fatal(err)
	}
	resp, err := list(us, &gpupassv1.ListNodesRequest{SpecFingerprint: fp})
	if err != nil || resp.TotalSize != 2 {
		t.Errorf("after a dry run, a us-only reader's nodes certified for the spec: %v, %v", resp, err)
	}
}
