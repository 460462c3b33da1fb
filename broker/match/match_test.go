package match

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/health"
	"github.com/gpupass/gpupass/internal/spec"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func node(id, region, class string, count int, price, rtt float64) store.Node {
	return store.Node{
		ID: id, Labels: store.Labels{Region: region}, HasReport: true, LastSeen: now.Add(-time.Second), RTTMS: rtt,
		Index: store.NodeIndex{Region: region, Accelerator: class, GPUCount: count, PricePerHour: price, Passed: true,
			StorageClass: "ultra-nvme", StorageFreeGB: 8000, BandwidthGbps: 400,
			Runtime: conformance.Runtime{NvidiaDriver: "535.104.05", CUDA: "12.1.105", Python: "3.10.12", PyTorch: "2.1.0+cu121"}},
	}
}

func testSpec() *spec.Spec {
	return &spec.Spec{
		Runtime: spec.Runtime{NvidiaDriver: "535.104.05", CUDA: "12.1.105", Python: "3.10.12", PyTorch: "2.1.0+cu121"},
		Resources: spec.Resources{Accelerator: "h100-sxm5", Count: 8,
			Storage: spec.Storage{Type: "high-iops-nvme", SizeGB: 4000},
			Network: spec.Network{BandwidthGbps: 200, LatencyToleranceMS: 50}},
	}
}

func TestScoreTerms(t *testing.T) {
	t.Parallel()
	// Class mean of h100-sxm5 is (20+30+40)/3 = 30.
	nodes := []store.Node{
		node("a", "us-west-2", "h100-sxm5", 8, 20, 10), // 100 - 1 - 0 - 2*(-33.33) -> capped 100
		node("b", "us-west-2", "h100-sxm5", 8, 30, 80), // latency capped at 50: 100 - 5 - 10 - 0 = 85
		node("c", "us-west-2", "h100-sxm5", 8, 40, 20), // 100 - 2 - 0 - 2*33.33 = 31.33
	}
	launches := map[string]store.LaunchStats{"b": {Launches: 10, Failures: 2}}
	out := Run(Input{Spec: testSpec(), Nodes: nodes, Launches: launches, Scope: []string{"*"}, MinScore: 85, Now: now, OfflineAfter: 30 * time.Second})
	got := map[string]health.Score{}
	for _, r := range append(out.Candidates, out.Excluded...) {
		got[r.Node.ID] = r.Score
	}
	want := map[string]health.Score{
		"a": {Score: 100, LatencyMS: 10, LatencyUsedMS: 10, LatencyCapMS: 50, LatencyPenalty: 1, ClassMeanPrice: 30, PricePremiumPct: -100.0 / 3, PricePenalty: -200.0 / 3},
		"b": {Score: 85, LatencyMS: 80, LatencyUsedMS: 50, LatencyCapMS: 50, LatencyPenalty: 5, FailureRatePct: 20, Launches24h: 10, LaunchFailures24h: 2, FailurePenalty: 100, ClassMeanPrice: 30},
		"c": {Score: 100 - 2 - 200.0/3, LatencyMS: 20, LatencyUsedMS: 20, LatencyCapMS: 50, LatencyPenalty: 2, ClassMeanPrice: 30, PricePremiumPct: 100.0 / 3, PricePenalty: 200.0 / 3},
	}
	// b: 20% failures -> 5*20 = 100 penalty: score -5.
	bw := want["b"]
	bw.Score = 100 - 5 - 100
	want["b"] = bw
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("scores (-want +got):\n%s", diff)
	}
	if len(out.Candidates) != 1 || out.Candidates[0].Node.ID != "a" {
		t.Errorf("candidates = %v, want only a", ids(out.Candidates))
	}
}

func ids(rs []*Result) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Node.ID)
	}
	return out
}

func codes(r *Result) []string {
	var out []string
	for _, x := range r.Reasons {
		out = append(out, x.Code+":"+x.Field)
	}
	return out
}

func TestExclusionReasons(t *testing.T) {
	t.Parallel()
	base := func(id string) store.Node { return node(id, "us-west-2", "h100-sxm5", 8, 30, 5) }
	tests := []struct {
		name   string
		node   func() store.Node
		in     func(*Input)
		want   []string
		expect string // Expected of the first reason
		meas   string // Measured of the first reason
	}{
		{name: "match", node: func() store.Node { return base("n") }},
		{name: "cuda mismatch", node: func() store.Node { n := base("n"); n.Index.Runtime.CUDA = "12.2.140"; return n },
			want: []string{"runtime_mismatch:runtime.cuda"}, expect: "12.1.105", meas: "12.2.140"},
		{name: "driver and fips", node: func() store.Node { n := base("n"); n.Index.Runtime.NvidiaDriver = "550.54.15"; return n },
			in:   func(in *Input) { in.Spec.Security.FIPSCompliant = true },
			want: []string{"runtime_mismatch:runtime.nvidia-driver", "runtime_mismatch:security.fips-compliant"}, expect: "535.104.05", meas: "550.54.15"},
		{name: "class", node: func() store.Node { n := base("n"); n.Index.Accelerator = "a100-80gb"; return n },
			want: []string{"resource_mismatch:resources.accelerator"}, expect: "h100-sxm5", meas: "a100-80gb"},
		{name: "count", node: func() store.Node { n := base("n"); n.Index.GPUCount = 4; return n },
			want: []string{"resource_mismatch:resources.count"}, expect: ">= 8", meas: "4"},
		{name: "storage class lower", node: func() store.Node { n := base("n"); n.Index.StorageClass = "standard"; return n },
			want: []string{"resource_mismatch:resources.storage.type"}, expect: "high-iops-nvme", meas: "standard"},
		{name: "storage size", node: func() store.Node { n := base("n"); n.Index.StorageFreeGB = 1000; return n },
			want: []string{"resource_mismatch:resources.storage.size_gb"}, expect: ">= 4000", meas: "1000"},
		{name: "bandwidth", node: func() store.Node { n := base("n"); n.Index.BandwidthGbps = 100; return n },
			want: []string{"resource_mismatch:resources.network.bandwidth_gbps"}, expect: ">= 200", meas: "100"},
		{name: "offline", node: func() store.Node { n := base("n"); n.LastSeen = now.Add(-time.Hour); return n },
			want: []string{"offline:heartbeat"}, meas: "2026-11-29T11:00:00Z"},
		{name: "never seen", node: func() store.Node { n := base("n"); n.LastSeen = time.Time{}; return n },
			want: []string{"offline:heartbeat"}, meas: "never"},
		{name: "no report", node: func() store.Node { n := base("n"); n.HasReport = false; n.Index = store.NodeIndex{}; return n },
			want: []string{"no_report:"}},
		{name: "failed conformance", node: func() store.Node { n := base("n"); n.Index.Passed = false; return n },
			want: []string{"conformance_failed:"}},
		{name: "price", node: func() store.Node { return base("n") }, in: func(in *Input) { in.MaxPrice = 25 },
			want: []string{"price_above_max:price_per_hour"}, expect: "<= 25", meas: "30"},
		{name: "score", node: func() store.Node { n := base("n"); n.RTTMS = 40; return n }, in: func(in *Input) { in.MinScore = 99 },
			want: []string{"score_below_threshold:health_score"}, expect: ">= 99", meas: "96"},
		{name: "region filter", node: func() store.Node { return base("n") }, in: func(in *Input) { in.Regions = []string{"eu-*"} },
			want: []string{"region_filter:region"}, expect: "eu-*", meas: "us-west-2"},
		{name: "scope", node: func() store.Node { return base("n") }, in: func(in *Input) { in.Scope = []string{"eu-*", "ap-south-1"} },
			want: []string{"region_scope:region"}, expect: "eu-*,ap-south-1", meas: "us-west-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := Input{Spec: testSpec(), Nodes: []store.Node{tt.node()}, Scope: []string{"us-*"}, MinScore: 85, Now: now, OfflineAfter: 30 * time.Second}
			if tt.in != nil {
				tt.in(&in)
			}
			out := Run(in)
			if tt.want == nil {
				if len(out.Candidates) != 1 {
					t.Fatalf("want a candidate, got excluded %v", codes(out.Excluded[0]))
				}
				return
			}
			if len(out.Excluded) != 1 {
				t.Fatalf("want the node excluded, got candidates %v", ids(out.Candidates))
			}
			r := out.Excluded[0]
			if diff := cmp.Diff(tt.want, codes(r)); diff != "" {
				t.Errorf("reasons (-want +got):\n%s", diff)
			}
			if r.Reasons[0].Expected != tt.expect || r.Reasons[0].Measured != tt.meas {
				t.Errorf("first reason expected/measured = %q/%q, want %q/%q", r.Reasons[0].Expected, r.Reasons[0].Measured, tt.expect, tt.meas)
			}
			if r.Reasons[0].Message == "" {
				t.Error("reason without a message")
			}
		})
	}
}

func TestOrdering(t *testing.T) {
	t.Parallel()
	nodes := []store.Node{
		node("z", "us-west-2", "h100-sxm5", 8, 30, 10),
		node("y", "us-east-1", "h100-sxm5", 8, 30, 5),
		node("x", "eu-central-1", "h100-sxm5", 8, 30, 10),
		node("w", "us-east-1", "h100-sxm5", 2, 30, 1),
		node("v", "ap-south-1", "h100-sxm5", 8, 30, 1),
	}
	out := Run(Input{Spec: testSpec(), Nodes: nodes, Scope: []string{"us-*", "eu-*"}, MinScore: 85, Now: now, OfflineAfter: time.Minute})
	if diff := cmp.Diff([]string{"y", "x", "z"}, ids(out.Candidates)); diff != "" {
		t.Errorf("candidates (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"w", "v"}, ids(out.Excluded)); diff != "" {
		t.Errorf("excluded (-want +got):\n%s", diff)
	}
}

// TestAbsurdStoredPrices: prices stored before the broker refused them
// (two near MaxFloat64 made the class mean +Inf and every other score
// NaN) stay out of the class mean, and the 60/h node stays excluded for
// its price. (A NaN score cannot arise: health.Compute turns it into -Inf,
// see its test.)
func TestAbsurdStoredPrices(t *testing.T) {
	t.Parallel()
	nodes := []store.Node{
		node("a", "us-west-2", "h100-sxm5", 8, 20, 5),
		node("b", "us-west-2", "h100-sxm5", 8, 24, 5),
		node("c", "us-west-2", "h100-sxm5", 8, 25, 5),
		node("ap", "us-west-2", "h100-sxm5", 8, 60, 5),
		node("huge1", "us-west-2", "h100-sxm5", 8, 1.7e308, 5),
		node("huge2", "us-west-2", "h100-sxm5", 8, 1.7e308, 5),
		node("inf", "us-west-2", "h100-sxm5", 8, math.Inf(1), 5),
	}
	out := Run(Input{Spec: testSpec(), Nodes: nodes, Scope: []string{"*"}, MinScore: 85, Now: now, OfflineAfter: time.Minute})
	if diff := cmp.Diff([]string{"a", "b", "c"}, ids(out.Candidates)); diff != "" {
		t.Errorf("candidates (-want +got):\n%s", diff)
	}
	for _, r := range append(out.Candidates, out.Excluded...) {
		if s := r.Score; math.IsNaN(s.Score) || s.ClassMeanPrice != (20+24+25+60)/4.0 {
			t.Errorf("%s: score %v with class mean %v, want a number and the mean of the fair prices", r.Node.ID, s.Score, s.ClassMeanPrice)
		}
	}
}
