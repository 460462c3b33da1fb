// Package health is the node health score of DESIGN §3, in one place for
// the broker, which scores nodes, and the client, which recomputes the
// terms of a dry-run answer that left them out (api.ExpandDryRun):
//
//	score = min(100, 100 - 0.1*latency_ms - 5*failure_rate_pct_24h - 2*price_premium_pct)
//
// Both sides must get the same bits from the same inputs, so every
// product is rounded by an explicit conversion: the Go spec lets a
// compiler fuse x*y+z into one instruction otherwise (arm64 does; amd64
// with GOAMD64=v3 does), and a client built for another architecture
// would print a score a last bit off the broker's.
package health

import "math"

// Score is the health score with each of its terms: what the broker
// matches on, stores with a run (its JSON, so the field names are a
// stored format), sends as gpupassv1.HealthScore (proto.go converts) and
// the CLI prints in runs, nodes and dry-run answers
// (docs/operating-the-broker.md "Broker and agents").
type Score struct {
	Score             float64 `json:"score"`
	LatencyMS         float64 `json:"latency_ms"`
	LatencyUsedMS     float64 `json:"latency_used_ms"`
	LatencyCapMS      float64 `json:"latency_cap_ms"`
	LatencyPenalty    float64 `json:"latency_penalty"`
	FailureRatePct    float64 `json:"failure_rate_pct"`
	Launches24h       int64   `json:"launches_24h"`
	LaunchFailures24h int64   `json:"launch_failures_24h"`
	FailurePenalty    float64 `json:"failure_penalty"`
	ClassMeanPrice    float64 `json:"class_mean_price"`
	PricePremiumPct   float64 `json:"price_premium_pct"`
	PricePenalty      float64 `json:"price_penalty"`
}

// Compute scores a node from its inputs: rttMS is its heartbeat latency
// (0 or less: not measured), capMS the spec's latency tolerance (0: none),
// launches and failures its launches over 24 h, price its price per hour
// and classMean the mean price of its accelerator class (0: none).
func Compute(rttMS, capMS float64, launches, failures int64, price, classMean float64) Score {
	t := Score{LatencyCapMS: capMS, Launches24h: launches, LaunchFailures24h: failures, ClassMeanPrice: classMean}
	if launches > 0 {
		t.FailureRatePct = float64(100*float64(failures)) / float64(launches)
	}
	t.FailurePenalty = float64(5 * t.FailureRatePct)
	if classMean > 0 && price > 0 {
		t.PricePremiumPct = float64((price - classMean) / classMean * 100)
	}
	t.PricePenalty = float64(2 * t.PricePremiumPct)
	if rttMS > 0 {
		t.LatencyMS = rttMS
	}
	t.LatencyUsedMS = t.LatencyMS
	if capMS > 0 && t.LatencyUsedMS > capMS {
		t.LatencyUsedMS = capMS
	}
	t.LatencyPenalty = float64(0.1 * t.LatencyUsedMS)
	t.Score = min(100, 100-t.LatencyPenalty-t.FailurePenalty-t.PricePenalty)
	if math.IsNaN(t.Score) {
		// Non-finite inputs (an infinite class mean): the lowest score,
		// which fails every threshold and ranks last, where callers'
		// comparisons and sorts would otherwise take NaN for a high one.
		t.Score = math.Inf(-1)
	}
	return t
}
