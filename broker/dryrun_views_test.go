package broker_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestDryRunViews checks that the four layouts of a dry-run answer carry
// the same verdicts: the inline view (reasons by reference) and the
// columns view, once expanded as the CLI does, equal the expanded inline
// view (nodes in short form unless full_nodes is asked for), and the
// summary counts the same excluded nodes per reason. The token sees us-* and eu-* only,
// so out-of-scope nodes (id and region only) are in the answer too. Each
// view asked with a limit lists the first nodes of its answer with all,
// and counts every node.
func TestDryRunViews(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	fleet(t, b)
	c := b.Clients(t, b.Token(t, store.RoleRead, "us-*", "eu-*"))
	ctx := context.Background()
	min := 90.0
	ask := func(view gpupassv1.DryRunView, opts ...func(*gpupassv1.DryRunRequest)) *gpupassv1.DryRunResponse {
		t.Helper()
		req := &gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)},
			Regions: []string{"us-*"}, MaxPrice: 24.5, MinHealthScore: &min, View: view}
		for _, o := range opts {
			o(req)
		}
		resp, err := c.Node.DryRun(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("dry-run, view %v: %v", view, err)
		}
		return resp.Msg
	}
	inline := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED, listAll)
	refs := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_UNSPECIFIED, listAll)
	cols := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, listAll)
	summary := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY, listAll)
	derived := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, deriveTerms, listAll)
	refsFull := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE, fullNodes, listAll)
	summaryFull := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY, fullNodes, listAll)

	if len(inline.Excluded) != 5 || inline.ExcludedTotal != 5 || len(inline.Candidates) != 1 {
		t.Fatalf("inline: %d candidates, %d excluded (total %d); want 1 and 5", len(inline.Candidates), len(inline.Excluded), inline.ExcludedTotal)
	}
	// The default inline view refers to each reason by index into one
	// table; expanded, it is the expanded view.
	if len(refs.Reasons) == 0 || len(refs.Excluded) != 5 || len(refs.Excluded[0].Reasons) != 0 || len(refs.Excluded[0].ReasonRefs) == 0 {
		t.Fatalf("default inline view: %d reasons in the table, %d excluded, first with %d reasons written out and %d referenced; want a table and references only",
			len(refs.Reasons), len(refs.Excluded), len(refs.Excluded[0].GetReasons()), len(refs.Excluded[0].GetReasonRefs()))
	}
	counts := sameVerdicts(t, inline, views{refs, refsFull, cols, summary, summaryFull, derived})
	if len(summary.Excluded) != 0 || summary.ExcludedTotal != 5 || len(summary.Candidates) != 1 || summary.Candidates[0].Node.Runtime != nil {
		t.Errorf("summary: %d excluded listed (want 0), total %d (want 5), candidates %v", len(summary.Excluded), summary.ExcludedTotal, summary.Candidates)
	}
	if got := counts["region_scope:region"]; got != 1 {
		t.Errorf("out-of-scope nodes counted %d, want 1 (ap-south-1)", got)
	}
	// 1 candidate and 5 excluded: the default limit lists them all, 2
	// cuts the excluded list, 1 both.
	for _, limit := range []int32{0, 2, 1} {
		sameCut(t, ask, limit)
	}

	for name, req := range map[string]*gpupassv1.DryRunRequest{
		"unknown view":   {Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}, View: 42},
		"negative limit": {Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}, Limit: -1},
	} {
		_, err := c.Node.DryRun(ctx, connect.NewRequest(req))
		if brokertest.Code(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
}

// askFunc asks the dry-run of a test in one view.
type askFunc func(view gpupassv1.DryRunView, opts ...func(*gpupassv1.DryRunRequest)) *gpupassv1.DryRunResponse

func listAll(r *gpupassv1.DryRunRequest) { r.All = true }

// sameCut asks the dry-run in every view twice, with all and with limit
// (0: the default), and checks that the second, expanded, is the first
// with each list cut to the limit: the best candidates and the nearest
// misses, with the same verdicts, totals and reason counts.
func sameCut(t *testing.T, ask askFunc, limit int32) {
	t.Helper()
	n := int(limit)
	if n == 0 {
		n = api.DefaultDryRunLimit
	}
	withLimit := func(r *gpupassv1.DryRunRequest) { r.Limit = limit }
	for _, vc := range []struct {
		name string
		view gpupassv1.DryRunView
		opt  func(*gpupassv1.DryRunRequest)
	}{
		{"INLINE_EXPANDED", gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED, nil},
		{"INLINE", gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE, nil},
		{"INLINE full_nodes", gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE, fullNodes},
		{"COLUMNS", gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, nil},
		{"COLUMNS derive_score_terms", gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, deriveTerms},
		{"SUMMARY", gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY, nil},
		{"SUMMARY full_nodes", gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY, fullNodes},
	} {
		opts := func(last func(*gpupassv1.DryRunRequest)) []func(*gpupassv1.DryRunRequest) {
			if vc.opt == nil {
				return []func(*gpupassv1.DryRunRequest){last}
			}
			return []func(*gpupassv1.DryRunRequest){vc.opt, last}
		}
		all, cut := ask(vc.view, opts(listAll)...), ask(vc.view, opts(withLimit)...)
		// The reason table of a cut answer has only what its listed
		// nodes refer to.
		used := map[uint32]bool{}
		for _, r := range cut.GetExcludedColumns().GetReasonRefs() {
			used[r] = true
		}
		for _, x := range cut.Excluded {
			for _, r := range x.ReasonRefs {
				used[r] = true
			}
		}
		if len(cut.Reasons) != len(used) {
			t.Errorf("%s with limit %d: %d reasons in the table, %d referenced", vc.name, limit, len(cut.Reasons), len(used))
		}
		if err := api.ExpandDryRun(all); err != nil {
			t.Fatal(err)
		}
		if err := api.ExpandDryRun(cut); err != nil {
			t.Fatalf("%s, limit %d: %v", vc.name, limit, err)
		}
		if int(all.CandidatesTotal) != len(all.Candidates) || (vc.view != gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY && int(all.ExcludedTotal) != len(all.Excluded)) {
			t.Fatalf("%s with all: %d of %d candidates and %d of %d excluded listed, want every one",
				vc.name, len(all.Candidates), all.CandidatesTotal, len(all.Excluded), all.ExcludedTotal)
		}
		all.Candidates, all.Excluded = all.Candidates[:min(n, len(all.Candidates))], all.Excluded[:min(n, len(all.Excluded))]
		if diff := cmp.Diff(all, cut, protocmp.Transform()); diff != "" {
			t.Errorf("%s with limit %d differs from its answer with all, cut to %d (-all, cut +limit):\n%s", vc.name, limit, n, short(diff))
		}
	}
}

func deriveTerms(r *gpupassv1.DryRunRequest) { r.DeriveScoreTerms = true }
func fullNodes(r *gpupassv1.DryRunRequest)   { r.FullNodes = true }

// views are the answers to one dry-run in each layout besides
// INLINE_EXPANDED: INLINE (refs), INLINE with full_nodes, COLUMNS,
// SUMMARY, SUMMARY with full_nodes, COLUMNS with derive_score_terms.
type views struct{ refs, refsFull, cols, summary, summaryFull, derived *gpupassv1.DryRunResponse }

// sameVerdicts checks that the views of one dry-run carry the same
// verdicts as its INLINE_EXPANDED answer (see TestDryRunViews) and
// returns the excluded nodes counted per "code:field" from it. It expands
// the answers in place.
func sameVerdicts(t *testing.T, inline *gpupassv1.DryRunResponse, v views) map[string]int32 {
	t.Helper()
	refs, cols, summary, derived := v.refs, v.cols, v.summary, v.derived
	// With full_nodes, the default view expanded is INLINE_EXPANDED.
	if err := api.ExpandDryRun(v.refsFull); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inline, v.refsFull, protocmp.Transform()); diff != "" {
		t.Errorf("expanded inline view with full_nodes differs from INLINE_EXPANDED (-expanded +full_nodes):\n%s", short(diff))
	}
	// Without, its candidates are in short form.
	if err := api.ExpandDryRun(refs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(leanAnswer(inline), refs, protocmp.Transform()); diff != "" {
		t.Errorf("expanded default inline view differs from INLINE_EXPANDED with short-form candidates (-expanded +default):\n%s", short(diff))
	}
	if len(cols.Candidates) != 0 || len(cols.Excluded) != 0 || len(cols.Reasons) == 0 || cols.ExcludedColumns == nil {
		t.Fatalf("columns view before expansion: %d candidates, %d excluded, %d reasons", len(cols.Candidates), len(cols.Excluded), len(cols.Reasons))
	}
	if err := api.ExpandDryRun(cols); err != nil {
		t.Fatal(err)
	}
	// INLINE_EXPANDED's candidates are in full; the columns carry the
	// short form.
	want := leanAnswer(inline)
	if diff := cmp.Diff(want, cols, protocmp.Transform()); diff != "" {
		t.Errorf("expanded columns view differs from the inline view (-inline +columns):\n%s", short(diff))
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
		t.Errorf("expanded columns view with derived terms differs from the inline view (-inline +derived):\n%s", short(diff))
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
		t.Errorf("summary reason counts (-counted from inline +summary):\n%s", short(diff))
	}
	// Each count's examples are its first three nodes in the list.
	examples := map[string][]string{}
	for _, x := range inline.Excluded {
		for _, r := range x.Reasons {
			k := r.Code + ":" + r.Field
			if e := examples[k]; len(e) < 3 && (len(e) == 0 || e[len(e)-1] != x.Node.Id) {
				examples[k] = append(e, x.Node.Id)
			}
		}
	}
	gotEx := map[string][]string{}
	for _, rc := range summary.ReasonCounts {
		gotEx[rc.Code+":"+rc.Field] = rc.ExampleNodeIds
	}
	if diff := cmp.Diff(examples, gotEx); diff != "" {
		t.Errorf("summary reason counts' example nodes (-first in the inline list +summary):\n%s", short(diff))
	}
	if int(inline.CandidatesTotal) != len(inline.Candidates) || int(summary.CandidatesTotal) != len(inline.Candidates) {
		t.Errorf("candidates_total: inline %d, summary %d, want %d", inline.CandidatesTotal, summary.CandidatesTotal, len(inline.Candidates))
	}
	// The same candidates in the same order, in short form unless asked
	// for in full, and the totals.
	if diff := cmp.Diff(want.Candidates, summary.Candidates, protocmp.Transform()); diff != "" {
		t.Errorf("summary candidates differ from the inline view's in short form (-inline +summary):\n%s", short(diff))
	}
	if diff := cmp.Diff(inline.Candidates, v.summaryFull.Candidates, protocmp.Transform()); diff != "" {
		t.Errorf("summary candidates with full_nodes differ from the inline view's (-inline +summary):\n%s", short(diff))
	}
	if len(summary.Excluded) != 0 || summary.ExcludedTotal != inline.ExcludedTotal || summary.SpecFingerprint != inline.SpecFingerprint {
		t.Errorf("summary: %d excluded listed (want 0), total %d (want %d)", len(summary.Excluded), summary.ExcludedTotal, inline.ExcludedTotal)
	}
	if diff := cmp.Diff(inline.ReasonCounts, summary.ReasonCounts, protocmp.Transform()); diff != "" {
		t.Errorf("summary reason_counts differ from the inline view's (-inline +summary):\n%s", short(diff))
	}
	return counts
}

// leanAnswer is an INLINE_EXPANDED answer with its candidates in the
// short form that every other view sends by default.
func leanAnswer(inline *gpupassv1.DryRunResponse) *gpupassv1.DryRunResponse {
	lean := func(n *gpupassv1.Node) *gpupassv1.Node {
		return &gpupassv1.Node{Id: n.Id, Provider: n.Provider, Region: n.Region, Accelerator: n.Accelerator, GpuCount: n.GpuCount,
			PricePerHour: n.PricePerHour, Online: n.Online, LastSeenUnixNano: n.LastSeenUnixNano, RttMs: n.RttMs,
			Simulated: n.Simulated, ConformancePassed: n.ConformancePassed, Health: n.Health}
	}
	want := &gpupassv1.DryRunResponse{SpecFingerprint: inline.SpecFingerprint, MinHealthScore: inline.MinHealthScore,
		Excluded: inline.Excluded, ReasonCounts: inline.ReasonCounts, ExcludedTotal: inline.ExcludedTotal, CandidatesTotal: inline.CandidatesTotal}
	for _, cd := range inline.Candidates {
		want.Candidates = append(want.Candidates, &gpupassv1.Candidate{Node: lean(cd.Node)})
	}
	return want
}

// short cuts a diff of 10,000-node answers to what a reader needs.
func short(diff string) string {
	if len(diff) > 4000 {
		return diff[:4000] + "\n…"
	}
	return diff
}

// TestDryRunViewsAt10k compares the views at the size the speed goals
// are set for (10,000 nodes of the benchmark's fleet: six regions, two
// CUDA versions, two accelerator classes, prices from 18 to 30), with a
// token scope, a region filter and a price cap so that every kind of
// reason, out-of-scope nodes and the shared reason table are exercised.
func TestDryRunViewsAt10k(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: 10,000 nodes")
	}
	db := brokertest.NewDB(t, "sqlite")
	populate(t, db.Open(t), 10000)
	b := brokertest.Start(t, db, broker.Config{OfflineAfter: 2 * time.Hour})
	c := b.Clients(t, b.Token(t, store.RoleRead, "us-*", "eu-*"))
	ctx := context.Background()
	ask := func(view gpupassv1.DryRunView, opts ...func(*gpupassv1.DryRunRequest)) *gpupassv1.DryRunResponse {
		t.Helper()
		req := &gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: mustRead(t, "testdata/h100.yaml")},
			Regions: []string{"us-*", "eu-central-1"}, MaxPrice: 28, View: view}
		for _, o := range opts {
			o(req)
		}
		resp, err := c.Node.DryRun(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("dry-run, view %v: %v", view, err)
		}
		return resp.Msg
	}
	inline := ask(gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED, listAll)
	counts := sameVerdicts(t, inline, views{refs: ask(gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE, listAll), refsFull: ask(gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE, fullNodes, listAll),
		cols: ask(gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, listAll), summary: ask(gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY, listAll),
		summaryFull: ask(gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY, fullNodes, listAll), derived: ask(gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, deriveTerms, listAll)})
	if n := len(inline.Candidates) + len(inline.Excluded); n != 10000 || len(inline.Candidates) == 0 {
		t.Fatalf("%d candidates and %d excluded; want some candidates and 10,000 nodes in all", len(inline.Candidates), len(inline.Excluded))
	}
	for _, code := range []string{"region_scope:region", "region_filter:region", "price_above_max:price_per_hour"} {
		if counts[code] == 0 {
			t.Errorf("no node excluded for %s; the fixture should exercise it (counts %v)", code, counts)
		}
	}
	// The default limit and a small one cut both lists here.
	for _, limit := range []int32{0, 7} {
		sameCut(t, ask, limit)
	}
}
