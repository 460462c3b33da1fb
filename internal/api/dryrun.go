package api

import (
	"fmt"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// ExpandDryRun turns a DRY_RUN_VIEW_COLUMNS answer into the inline layout:
// candidates and excluded as messages (nodes in short form), each excluded
// node with its reasons (shared between nodes, not copied: treat them as
// read-only). The columns and the reason table are dropped, so what a
// client prints, text or JSON, does not depend on the view it asked for.
// A malformed answer (columns of different lengths, a reference outside
// the table) is an error, never a wrong line. Other views pass unchanged.
func ExpandDryRun(m *gpupassv1.DryRunResponse) error {
	if m.CandidateColumns == nil && m.ExcludedColumns == nil {
		return nil
	}
	nodes, _, err := expandColumns(m.CandidateColumns, nil)
	if err != nil {
		return fmt.Errorf("dry-run answer: candidate_columns: %w", err)
	}
	m.Candidates = make([]*gpupassv1.Candidate, len(nodes))
	cs := make([]gpupassv1.Candidate, len(nodes))
	for i, n := range nodes {
		cs[i].Node = n
		m.Candidates[i] = &cs[i]
	}
	nodes, reasons, err := expandColumns(m.ExcludedColumns, m.Reasons)
	if err != nil {
		return fmt.Errorf("dry-run answer: excluded_columns: %w", err)
	}
	m.Excluded = make([]*gpupassv1.Excluded, len(nodes))
	xs := make([]gpupassv1.Excluded, len(nodes))
	for i, n := range nodes {
		xs[i].Node, xs[i].Reasons = n, reasons[i]
		m.Excluded[i] = &xs[i]
	}
	m.CandidateColumns, m.ExcludedColumns, m.Reasons = nil, nil, nil
	return nil
}

// expandColumns makes the nodes of c and each one's reasons.
func expandColumns(c *gpupassv1.NodeColumns, table []*gpupassv1.Reason) ([]*gpupassv1.Node, [][]*gpupassv1.Reason, error) {
	n := len(c.GetId())
	if l := len(c.GetRegion()); l != n {
		return nil, nil, fmt.Errorf("column region has %d entries for %d nodes", l, n)
	}
	// Other columns are empty when all zero (broker.proto): fill them in.
	var err error
	full := func(name string, l int) bool {
		if l != 0 && l != n && err == nil {
			err = fmt.Errorf("column %s has %d entries for %d nodes", name, l, n)
		}
		return l == n
	}
	c.Provider = fill(c.Provider, n, full("provider", len(c.Provider)))
	c.Accelerator = fill(c.Accelerator, n, full("accelerator", len(c.Accelerator)))
	c.GpuCount = fill(c.GpuCount, n, full("gpu_count", len(c.GpuCount)))
	c.PricePerHour = fill(c.PricePerHour, n, full("price_per_hour", len(c.PricePerHour)))
	c.Online = fill(c.Online, n, full("online", len(c.Online)))
	c.LastSeenUnixNano = fill(c.LastSeenUnixNano, n, full("last_seen_unix_nano", len(c.LastSeenUnixNano)))
	c.RttMs = fill(c.RttMs, n, full("rtt_ms", len(c.RttMs)))
	c.Simulated = fill(c.Simulated, n, full("simulated", len(c.Simulated)))
	c.ConformancePassed = fill(c.ConformancePassed, n, full("conformance_passed", len(c.ConformancePassed)))
	c.OutOfScope = fill(c.OutOfScope, n, full("out_of_scope", len(c.OutOfScope)))
	c.Score = fill(c.Score, n, full("score", len(c.Score)))
	c.LatencyMs = fill(c.LatencyMs, n, full("latency_ms", len(c.LatencyMs)))
	c.LatencyUsedMs = fill(c.LatencyUsedMs, n, full("latency_used_ms", len(c.LatencyUsedMs)))
	c.LatencyCapMs = fill(c.LatencyCapMs, n, full("latency_cap_ms", len(c.LatencyCapMs)))
	c.LatencyPenalty = fill(c.LatencyPenalty, n, full("latency_penalty", len(c.LatencyPenalty)))
	c.FailureRatePct = fill(c.FailureRatePct, n, full("failure_rate_pct", len(c.FailureRatePct)))
	c.Launches_24H = fill(c.Launches_24H, n, full("launches_24h", len(c.Launches_24H)))
	c.LaunchFailures_24H = fill(c.LaunchFailures_24H, n, full("launch_failures_24h", len(c.LaunchFailures_24H)))
	c.FailurePenalty = fill(c.FailurePenalty, n, full("failure_penalty", len(c.FailurePenalty)))
	c.ClassMeanPrice = fill(c.ClassMeanPrice, n, full("class_mean_price", len(c.ClassMeanPrice)))
	c.PricePremiumPct = fill(c.PricePremiumPct, n, full("price_premium_pct", len(c.PricePremiumPct)))
	c.PricePenalty = fill(c.PricePenalty, n, full("price_penalty", len(c.PricePenalty)))
	c.ReasonCount = fill(c.ReasonCount, n, full("reason_count", len(c.ReasonCount)))
	if err != nil {
		return nil, nil, err
	}
	str := func(col string, i uint32) (string, error) {
		if int(i) >= len(c.Strings) {
			return "", fmt.Errorf("%s refers to string %d of %d", col, i, len(c.Strings))
		}
		return c.Strings[i], nil
	}
	nodes := make([]*gpupassv1.Node, n)
	ns := make([]gpupassv1.Node, n)
	hs := make([]gpupassv1.HealthScore, n)
	reasons := make([][]*gpupassv1.Reason, n)
	refs := c.GetReasonRefs()
	for i := 0; i < n; i++ {
		p := &ns[i]
		nodes[i] = p
		p.Id = c.Id[i]
		if p.Region, err = str("region", c.Region[i]); err != nil {
			return nil, nil, err
		}
		if k := int(c.ReasonCount[i]); k > 0 {
			if k > len(refs) {
				return nil, nil, fmt.Errorf("node %s has %d reasons, %d references left", p.Id, k, len(refs))
			}
			reasons[i] = make([]*gpupassv1.Reason, k)
			for j, ref := range refs[:k] {
				if int(ref) >= len(table) {
					return nil, nil, fmt.Errorf("node %s refers to reason %d of %d", p.Id, ref, len(table))
				}
				reasons[i][j] = table[ref]
			}
			refs = refs[k:]
		}
		if c.OutOfScope[i] {
			continue
		}
		if p.Provider, err = str("provider", c.Provider[i]); err != nil {
			return nil, nil, err
		}
		if p.Accelerator, err = str("accelerator", c.Accelerator[i]); err != nil {
			return nil, nil, err
		}
		p.GpuCount, p.PricePerHour, p.Online, p.LastSeenUnixNano = c.GpuCount[i], c.PricePerHour[i], c.Online[i], c.LastSeenUnixNano[i]
		p.RttMs, p.Simulated, p.ConformancePassed = c.RttMs[i], c.Simulated[i], c.ConformancePassed[i]
		h := &hs[i]
		h.Score, h.LatencyMs, h.LatencyUsedMs, h.LatencyCapMs, h.LatencyPenalty = c.Score[i], c.LatencyMs[i], c.LatencyUsedMs[i], c.LatencyCapMs[i], c.LatencyPenalty[i]
		h.FailureRatePct, h.Launches_24H, h.LaunchFailures_24H, h.FailurePenalty = c.FailureRatePct[i], c.Launches_24H[i], c.LaunchFailures_24H[i], c.FailurePenalty[i]
		h.ClassMeanPrice, h.PricePremiumPct, h.PricePenalty = c.ClassMeanPrice[i], c.PricePremiumPct[i], c.PricePenalty[i]
		p.Health = h
	}
	if len(refs) > 0 {
		return nil, nil, fmt.Errorf("%d reason references left over", len(refs))
	}
	return nodes, reasons, nil
}

// fill returns col, or n zero values when col was sent empty (all zero).
func fill[T any](col []T, n int, isFull bool) []T {
	if isFull {
		return col
	}
	return make([]T, n)
}
