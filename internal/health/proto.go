package health

import gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"

// This file is the one conversion between Score and the API's
// HealthScore; TestProtoRoundTrip fails when a field is added to one
// and not converted.

// Fill sets h, a zero message (one of an answer's slab, say), to s and
// returns it.
func (s Score) Fill(h *gpupassv1.HealthScore) *gpupassv1.HealthScore {
	h.Score, h.LatencyMs, h.LatencyUsedMs, h.LatencyCapMs = s.Score, s.LatencyMS, s.LatencyUsedMS, s.LatencyCapMS
	h.LatencyPenalty, h.FailureRatePct, h.Launches_24H = s.LatencyPenalty, s.FailureRatePct, s.Launches24h
	h.LaunchFailures_24H, h.FailurePenalty, h.ClassMeanPrice = s.LaunchFailures24h, s.FailurePenalty, s.ClassMeanPrice
	h.PricePremiumPct, h.PricePenalty = s.PricePremiumPct, s.PricePenalty
	return h
}

// ToProto is s as the API's message.
func (s Score) ToProto() *gpupassv1.HealthScore {
	return s.Fill(new(gpupassv1.HealthScore))
}

// FromProto converts a score from the broker's API; nil stays nil (a run
// not yet placed has none).
func FromProto(h *gpupassv1.HealthScore) *Score {
	if h == nil {
		return nil
	}
	return &Score{Score: h.GetScore(), LatencyMS: h.GetLatencyMs(), LatencyUsedMS: h.GetLatencyUsedMs(),
		LatencyCapMS: h.GetLatencyCapMs(), LatencyPenalty: h.GetLatencyPenalty(), FailureRatePct: h.GetFailureRatePct(),
		Launches24h: h.GetLaunches_24H(), LaunchFailures24h: h.GetLaunchFailures_24H(), FailurePenalty: h.GetFailurePenalty(),
		ClassMeanPrice: h.GetClassMeanPrice(), PricePremiumPct: h.GetPricePremiumPct(), PricePenalty: h.GetPricePenalty()}
}
