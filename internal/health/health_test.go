package health

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestCompute(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		rtt, capMS       float64
		launches, failed int64
		price, classMean float64
		want             Score
	}{
		"nothing measured": {want: Score{Score: 100}},
		"latency under the cap": {rtt: 20, capMS: 50,
			want: Score{Score: 98, LatencyMS: 20, LatencyUsedMS: 20, LatencyCapMS: 50, LatencyPenalty: 2}},
		"latency capped": {rtt: 80, capMS: 50,
			want: Score{Score: 95, LatencyMS: 80, LatencyUsedMS: 50, LatencyCapMS: 50, LatencyPenalty: 5}},
		"negative rtt is unmeasured": {rtt: -1, want: Score{Score: 100}},
		"failures": {launches: 10, failed: 1,
			want: Score{Score: 50, FailureRatePct: 10, Launches24h: 10, LaunchFailures24h: 1, FailurePenalty: 50}},
		"premium": {price: 33, classMean: 30,
			want: Score{Score: 80, ClassMeanPrice: 30, PricePremiumPct: 10, PricePenalty: 20}},
		"cheaper lifts to the cap": {price: 27, classMean: 30, rtt: 10,
			want: Score{Score: 100, LatencyMS: 10, LatencyUsedMS: 10, LatencyPenalty: 1, ClassMeanPrice: 30, PricePremiumPct: -10, PricePenalty: -20}},
		"no class mean": {price: 33, want: Score{Score: 100}},
		"an infinite class mean scores lowest, not NaN": {price: 33, classMean: math.Inf(1),
			want: Score{Score: math.Inf(-1), ClassMeanPrice: math.Inf(1), PricePremiumPct: math.NaN(), PricePenalty: math.NaN()}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := Compute(tc.rtt, tc.capMS, tc.launches, tc.failed, tc.price, tc.classMean)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("Compute (-want +got):\n%s", diff)
			}
		})
	}
}
