package api

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

func columns(ids ...string) *gpupassv1.NodeColumns {
	n := len(ids)
	return &gpupassv1.NodeColumns{
		Id: ids, Strings: []string{"us-west-2", "lambda", "h100-sxm5"},
		Provider: make([]uint32, n), Region: make([]uint32, n), Accelerator: make([]uint32, n),
		GpuCount: make([]int32, n), PricePerHour: make([]float64, n), Online: make([]bool, n), LastSeenUnixNano: make([]int64, n),
		RttMs: make([]float64, n), Simulated: make([]bool, n), ConformancePassed: make([]bool, n), OutOfScope: make([]bool, n),
		Score: make([]float64, n), LatencyMs: make([]float64, n), LatencyUsedMs: make([]float64, n), LatencyCapMs: make([]float64, n),
		LatencyPenalty: make([]float64, n), FailureRatePct: make([]float64, n), Launches_24H: make([]int64, n),
		LaunchFailures_24H: make([]int64, n), FailurePenalty: make([]float64, n), ClassMeanPrice: make([]float64, n),
		PricePremiumPct: make([]float64, n), PricePenalty: make([]float64, n), ReasonCount: make([]uint32, n),
	}
}

func TestExpandDryRun(t *testing.T) {
	t.Parallel()
	reasons := []*gpupassv1.Reason{{Code: "offline"}, {Code: "runtime_mismatch", Field: "runtime.cuda"}}
	good := func() *gpupassv1.DryRunResponse {
		ex := columns("agt-b", "agt-c")
		ex.Provider[0], ex.Accelerator[0], ex.Score[0] = 1, 2, 91.5
		ex.ReasonCount = []uint32{2, 1}
		ex.ReasonRefs = []uint32{1, 0, 1}
		ex.OutOfScope[1] = true
		return &gpupassv1.DryRunResponse{CandidateColumns: columns("agt-a"), ExcludedColumns: ex, Reasons: reasons}
	}
	for _, tc := range []struct {
		name   string
		mutate func(m *gpupassv1.DryRunResponse)
		want   string
	}{
		{"short column", func(m *gpupassv1.DryRunResponse) { m.ExcludedColumns.Score = m.ExcludedColumns.Score[:1] }, "column score has 1 entries for 2 nodes"},
		{"reference past the table", func(m *gpupassv1.DryRunResponse) { m.ExcludedColumns.ReasonRefs[2] = 7 }, "refers to reason 7 of 2"},
		{"too few references", func(m *gpupassv1.DryRunResponse) { m.ExcludedColumns.ReasonRefs = m.ExcludedColumns.ReasonRefs[:2] }, "has 1 reasons, 0 references left"},
		{"references left over", func(m *gpupassv1.DryRunResponse) {
			m.ExcludedColumns.ReasonRefs = append(m.ExcludedColumns.ReasonRefs, 0)
		}, "1 reason references left over"},
		{"string past the table", func(m *gpupassv1.DryRunResponse) { m.CandidateColumns.Region[0] = 9 }, "candidate_columns: region refers to string 9 of 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := good()
			tc.mutate(m)
			if err := ExpandDryRun(m); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ExpandDryRun = %v, want an error with %q", err, tc.want)
			}
		})
	}

	m := good()
	if err := ExpandDryRun(m); err != nil {
		t.Fatal(err)
	}
	if m.CandidateColumns != nil || m.ExcludedColumns != nil || m.Reasons != nil {
		t.Error("columns and reason table kept after expansion")
	}
	if len(m.Candidates) != 1 || m.Candidates[0].Node.Id != "agt-a" || len(m.Excluded) != 2 {
		t.Fatalf("expanded %d candidates, %d excluded", len(m.Candidates), len(m.Excluded))
	}
	b := m.Excluded[0]
	if b.Node.Id != "agt-b" || b.Node.Provider != "lambda" || b.Node.Accelerator != "h100-sxm5" || b.Node.Region != "us-west-2" ||
		b.Node.Health.GetScore() != 91.5 || len(b.Reasons) != 2 || b.Reasons[0].Field != "runtime.cuda" || b.Reasons[1].Code != "offline" {
		t.Errorf("excluded agt-b expanded to %v", b)
	}
	if c := m.Excluded[1]; c.Node.Health != nil || c.Node.Provider != "" || len(c.Reasons) != 1 || c.Reasons[0].Code != "runtime_mismatch" {
		t.Errorf("out-of-scope agt-c expanded to %v, want id, region and its reason only", c)
	}
}

// TestExpandDerivedScoreTerms: with score_terms_derived the client
// computes each node's terms from its inputs (internal/health), the same
// terms the broker sends when it is not asked to leave them out.
func TestExpandDerivedScoreTerms(t *testing.T) {
	t.Parallel()
	c := columns("agt-a", "agt-b")
	c.Score, c.LatencyMs, c.LatencyUsedMs, c.LatencyCapMs, c.LatencyPenalty = nil, nil, nil, nil, nil
	c.FailureRatePct, c.FailurePenalty, c.PricePremiumPct, c.PricePenalty = nil, nil, nil, nil
	c.ScoreTermsDerived, c.DerivedLatencyCapMs = true, 50
	c.RttMs = []float64{12.5, 80}
	c.PricePerHour = []float64{33, 27}
	c.ClassMeanPrice = []float64{30, 30}
	c.Launches_24H, c.LaunchFailures_24H = []int64{10, 0}, []int64{1, 0}
	m := &gpupassv1.DryRunResponse{CandidateColumns: c, ExcludedColumns: &gpupassv1.NodeColumns{}}
	if err := ExpandDryRun(m); err != nil {
		t.Fatal(err)
	}
	want := []*gpupassv1.HealthScore{
		{Score: 100 - 1.25 - 50 - 20, LatencyMs: 12.5, LatencyUsedMs: 12.5, LatencyCapMs: 50, LatencyPenalty: 1.25, FailureRatePct: 10,
			Launches_24H: 10, LaunchFailures_24H: 1, FailurePenalty: 50, ClassMeanPrice: 30, PricePremiumPct: 10, PricePenalty: 20},
		{Score: 100, LatencyMs: 80, LatencyUsedMs: 50, LatencyCapMs: 50, LatencyPenalty: 5, ClassMeanPrice: 30, PricePremiumPct: -10, PricePenalty: -20},
	}
	for i, cd := range m.Candidates {
		if diff := cmp.Diff(want[i], cd.Node.Health, protocmp.Transform()); diff != "" {
			t.Errorf("%s health (-want +got):\n%s", cd.Node.Id, diff)
		}
	}
}

// TestExpandInlineRefs: an inline answer's reason references become the
// reasons themselves; a reference outside the table is an error.
func TestExpandInlineRefs(t *testing.T) {
	t.Parallel()
	answer := func(refs ...[]uint32) *gpupassv1.DryRunResponse {
		m := &gpupassv1.DryRunResponse{Reasons: []*gpupassv1.Reason{{Code: "offline"}, {Code: "runtime_mismatch", Field: "runtime.cuda"}}}
		for i, r := range refs {
			m.Excluded = append(m.Excluded, &gpupassv1.Excluded{Node: &gpupassv1.Node{Id: fmt.Sprintf("agt-%d", i)}, ReasonRefs: r})
		}
		return m
	}
	m := answer([]uint32{1, 0}, []uint32{0})
	if err := ExpandDryRun(m); err != nil {
		t.Fatal(err)
	}
	if m.Reasons != nil || m.Excluded[0].ReasonRefs != nil {
		t.Error("reason table or references kept after expansion")
	}
	got := [][]string{}
	for _, x := range m.Excluded {
		codes := []string{}
		for _, r := range x.Reasons {
			codes = append(codes, r.Code)
		}
		got = append(got, codes)
	}
	if diff := cmp.Diff([][]string{{"runtime_mismatch", "offline"}, {"offline"}}, got); diff != "" {
		t.Errorf("expanded reasons (-want +got):\n%s", diff)
	}
	if err := ExpandDryRun(answer([]uint32{0}, []uint32{2})); err == nil || !strings.Contains(err.Error(), "excluded node 1 refers to reason 2 of 2") {
		t.Errorf("ExpandDryRun with a reference past the table = %v, want an error naming node 1 and reason 2", err)
	}
}
