package ui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/ui"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
)

// cutNodes answers every dry-run as a broker of a large fleet does by
// default: a few nodes listed of many counted, one of them out of the
// token's scope. It records whether the request asked for all.
type cutNodes struct {
	gpupassv1connect.UnimplementedNodeServiceHandler
	all atomic.Bool
}

func (*cutNodes) ListNodes(context.Context, *connect.Request[gpupassv1.ListNodesRequest]) (*connect.Response[gpupassv1.ListNodesResponse], error) {
	return connect.NewResponse(&gpupassv1.ListNodesResponse{}), nil
}

func (n *cutNodes) DryRun(_ context.Context, req *connect.Request[gpupassv1.DryRunRequest]) (*connect.Response[gpupassv1.DryRunResponse], error) {
	n.all.Store(req.Msg.All)
	node := func(id, region string) *gpupassv1.Node {
		return &gpupassv1.Node{Id: id, Region: region, Health: &gpupassv1.HealthScore{Score: 90}}
	}
	return connect.NewResponse(&gpupassv1.DryRunResponse{
		SpecFingerprint: "sha256:x", MinHealthScore: 85, CandidatesTotal: 5000, ExcludedTotal: 7000,
		Candidates: []*gpupassv1.Candidate{{Node: node("agt-best", "us-west-2")}},
		Excluded:   []*gpupassv1.Excluded{{Node: node("agt-near", "us-west-2"), Reasons: []*gpupassv1.Reason{{Code: "runtime_mismatch", Field: "runtime.cuda", Message: "cuda differs"}}}},
		ReasonCounts: []*gpupassv1.ReasonCount{
			{Code: "runtime_mismatch", Field: "runtime.cuda", Nodes: 4000, ExampleNodeIds: []string{"agt-near", "agt-near2"}},
			{Code: match.CodeRegionScope, Field: "region", Nodes: 3000, ExampleNodeIds: []string{"agt-elsewhere"}},
		},
	}), nil
}

// TestDashboardDryRunCut: when the broker lists only some nodes, the
// dry-run page gives every count, says how many it does not list and how
// to see them, shows the reasons with examples, and names no node out of
// the token's scope; "list every node" asks the broker for all.
func TestDashboardDryRunCut(t *testing.T) {
	t.Parallel()
	nodes := &cutNodes{}
	mux := http.NewServeMux()
	mux.Handle(gpupassv1connect.NewNodeServiceHandler(nodes))
	srv, err := ui.New(ui.Config{API: mux, Lookup: func(context.Context, string) (ui.Token, error) {
		return ui.Token{ID: "tok-test", Role: "read", Regions: []string{"us-*"}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	b := newBrowser(t, hs.URL)
	csrf := b.login("gpp_x")
	for _, all := range []bool{false, true} {
		form := url.Values{"spec": {"name: x"}, "csrf": {csrf}}
		if all {
			form.Set("all", "1")
		}
		resp, page := b.do("POST", "/ui/dryrun", form, "Origin", hs.URL, "Sec-Fetch-Site", "same-origin")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("dry run: %s\n%s", resp.Status, tail(page, 1500))
		}
		if nodes.all.Load() != all {
			t.Errorf("list every node %v: the request's all is %v", all, nodes.all.Load())
		}
		for _, want := range []string{"5000 node(s) can run it", "agt-best", "4999 more are not", "7000 excluded", "agt-near",
			"6999 more excluded node(s) are not", `id="reason-counts"`, "<code>agt-near2</code>", "3000 node(s) outside your token"} {
			if !strings.Contains(page, want) {
				t.Errorf("dry-run page lacks %q:\n%s", want, tail(page, 3000))
			}
		}
		if strings.Contains(page, "agt-elsewhere") {
			t.Errorf("dry-run page names a node out of the token's scope:\n%s", tail(page, 3000))
		}
	}
}

// gangNodes answers a dry-run of a spec whose GPUs take two nodes.
type gangNodes struct {
	gpupassv1connect.UnimplementedNodeServiceHandler
}

func (*gangNodes) DryRun(context.Context, *connect.Request[gpupassv1.DryRunRequest]) (*connect.Response[gpupassv1.DryRunResponse], error) {
	return connect.NewResponse(&gpupassv1.DryRunResponse{SpecFingerprint: "sha256:x", MinHealthScore: 85,
		Gangs:      []*gpupassv1.Gang{{Region: "us-west-2", Accelerator: "a100-80gb", GpusPerNode: 4, NodeIds: []string{"agt-a", "agt-b"}}},
		GangMisses: []*gpupassv1.GangMiss{{Region: "eu-central-1", Reason: "3 certified a100-80gb nodes, but only 1 has ≥ 200 Gbit/s (a gang needs 2)"}},
	}), nil
}

// TestDashboardDryRunGangs (#34): the dry-run page shows each region's
// gang and why a region has none, as validate --dry-run does, and says
// which nodes take such runs.
func TestDashboardDryRunGangs(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle(gpupassv1connect.NewNodeServiceHandler(&gangNodes{}))
	srv, err := ui.New(ui.Config{API: mux, Lookup: func(context.Context, string) (ui.Token, error) {
		return ui.Token{ID: "tok-test", Role: "read", Regions: []string{"*"}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	b := newBrowser(t, hs.URL)
	csrf := b.login("gpp_x")
	resp, page := b.do("POST", "/ui/dryrun", url.Values{"spec": {"name: x"}, "csrf": {csrf}}, "Origin", hs.URL, "Sec-Fetch-Site", "same-origin")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dry run: %s\n%s", resp.Status, tail(page, 1500))
	}
	for _, want := range []string{`id="gangs"`, "2 × <code>agt-a</code> <code>agt-b</code> (4 × a100-80gb each)",
		"no gang: 3 certified a100-80gb nodes, but only 1 has ≥ 200 Gbit/s (a gang needs 2)", "whose agents take ranks (local agents started with <code>--job-address</code>"} {
		if !strings.Contains(page, want) {
			t.Errorf("dry-run page lacks %q:\n%s", want, tail(page, 3000))
		}
	}
}
