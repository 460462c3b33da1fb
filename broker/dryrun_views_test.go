package broker_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestDryRunViews checks that the four layouts of a dry-run answer carry
// the same verdicts: the inline view (reasons by reference) and the
// columns view, once expanded as the CLI does, equal the expanded inline
// view (columns: nodes in short form), and the summary counts
// the same excluded nodes per reason. The token sees us-* and eu-* only,
// so out-of-scope nodes (id and region only) are in the answer too.
func TestDryRunViews(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	fleet(t, b)
	c := b.Clients(t, b.Token(t, store.RoleRead, "us-*", "eu-*"))
	ctx := context.Background()
	min := 90.0
	ask := func(view gpupassv1.DryRunView, derive ...bool) *gpupassv1.DryRunResponse {
		t.Helper()
		resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)},
			Regions: []string{"us-*"}, MaxPrice: 24.5, MinHealthScore: &min, View: view, DeriveScoreTerms: len(derive) > 0}))
		if err != nil {
			t.Fatalf("dry-run, view %v: %v", view, err)
		}
		return resp.Msg
	}
	inline := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED)
	refs := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_UNSPECIFIED)
	cols := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS)
	summary := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY)
	derived := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, true)

	if len(inline.Excluded) != 5 || inline.ExcludedTotal != 5 || len(inline.Candidates) != 1 {
		t.Fatalf("inline: %d candidates, %d excluded (total %d); want 1 and 5", len(inline.Candidates), len(inline.Excluded), inline.ExcludedTotal)
	}
	// The default inline view refers to each reason by index into one
	// table; expanded, it is the expanded view.
	if len(refs.Reasons) == 0 || len(refs.Excluded) != 5 || len(refs.Excluded[0].Reasons) != 0 || len(refs.Excluded[0].ReasonRefs) == 0 {
		t.Fatalf("default inline view: %d reasons in the table, %d excluded, first with %d reasons written out and %d referenced; want a table and references only",
			len(refs.Reasons), len(refs.Excluded), len(refs.Excluded[0].GetReasons()), len(refs.Excluded[0].GetReasonRefs()))
	}
	if err := api.ExpandDryRun(refs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inline, refs, protocmp.Transform()); diff != "" {
		t.Errorf("expanded default inline view differs from INLINE_EXPANDED (-expanded +default):\n%s", diff)
	}
	if len(cols.Candidates) != 0 || len(cols.Excluded) != 0 || len(cols.Reasons) == 0 || cols.ExcludedColumns == nil {
		t.Fatalf("columns view before expansion: %d candidates, %d excluded, %d reasons", len(cols.Candidates), len(cols.Excluded), len(cols.Reasons))
	}
	if err := api.ExpandDryRun(cols); err != nil {
		t.Fatal(err)
	}
	// Inline candidates are in full; the columns carry the short form.
	short := func(n *gpupassv1.Node) *gpupassv1.Node {
		return &gpupassv1.Node{Id: n.Id, Provider: n.Provider, Region: n.Region, Accelerator: n.Accelerator, GpuCount: n.GpuCount,
			PricePerHour: n.PricePerHour, Online: n.Online, LastSeenUnixNano: n.LastSeenUnixNano, RttMs: n.RttMs,
			Simulated: n.Simulated, ConformancePassed: n.ConformancePassed, Health: n.Health}
	}
	want := &gpupassv1.DryRunResponse{SpecFingerprint: inline.SpecFingerprint, MinHealthScore: inline.MinHealthScore,
		Excluded: inline.Excluded, ReasonCounts: inline.ReasonCounts, ExcludedTotal: inline.ExcludedTotal}
	for _, cd := range inline.Candidates {
		want.Candidates = append(want.Candidates, &gpupassv1.Candidate{Node: short(cd.Node)})
	}
	if diff := cmp.Diff(want, cols, protocmp.Transform()); diff != "" {
		t.Errorf("expanded columns view differs from the inline view (-inline +columns):\n%s", diff)
	}
	// Derived score terms: left out of the answer, recomputed by the
	// client bit for bit (cmp compares floats exactly).
	for _, dc := range []*gpupassv1.NodeColumns{derived.CandidateColumns, derived.ExcludedColumns} {
		if !dc.GetScoreTermsDerived() || dc.Score != nil || dc.LatencyMs != nil || dc.PricePenalty != nil || dc.DerivedLatencyCapMs == 0 {
			t.Fatalf("derived columns: score_terms_derived %v, score %v, latency_ms %v, price_penalty %v, cap %v; want only the inputs",
				dc.GetScoreTermsDerived(), dc.Score, dc.LatencyMs, dc.PricePenalty, dc.DerivedLatencyCapMs)
		}
	}
	if err := api.ExpandDryRun(derived); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, derived, protocmp.Transform()); diff != "" {
		t.Errorf("expanded columns view with derived terms differs from the inline view (-inline +derived):\n%s", diff)
	}

	// Summary: candidates in full, excluded only counted.
	counts := map[string]int32{}
	for _, x := range inline.Excluded {
		for _, r := range x.Reasons {
			counts[r.Code+":"+r.Field]++
		}
	}
	got := map[string]int32{}
	for _, rc := range summary.ReasonCounts {
		got[rc.Code+":"+rc.Field] = rc.Nodes
	}
	if diff := cmp.Diff(counts, got); diff != "" {
		t.Errorf("summary reason counts (-counted from inline +summary):\n%s", diff)
	}
	if len(summary.Excluded) != 0 || summary.ExcludedTotal != 5 || len(summary.Candidates) != 1 || summary.Candidates[0].Node.Runtime == nil {
		t.Errorf("summary: %d excluded listed (want 0), total %d (want 5), candidates %v", len(summary.Excluded), summary.ExcludedTotal, summary.Candidates)
	}
	if got := counts["region_scope:region"]; got != 1 {
		t.Errorf("out-of-scope nodes counted %d, want 1 (ap-south-1)", got)
	}

	_, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}, View: 42}))
	if brokertest.Code(err) != connect.CodeInvalidArgument {
		t.Errorf("unknown view: %v, want invalid_argument", err)
	}
}
