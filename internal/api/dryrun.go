package api

import (
	"fmt"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/health"
)

// ExpandDryRun turns a DRY_RUN_VIEW_COLUMNS answer into the inline layout:
// candidates and excluded as messages (nodes in short form), each excluded
// node with its reasons (shared between nodes, not copied: treat them as
// read-only). The columns and the reason table are dropped, so what a
// client prints, text or JSON, does not depend on the view it asked for.
// A malformed answer (columns of different lengths, a reference outside
// the table) is an error, never a wrong line. A DRY_RUN_VIEW_INLINE
// answer gets each excluded node's reasons from its reason_refs, so it
// reads as DRY_RUN_VIEW_INLINE_EXPANDED. Other views pass unchanged.
func ExpandDryRun(m *gpupassv1.DryRunResponse) error {
	if m.CandidateColumns == nil && m.ExcludedColumns == nil {
		return expandRefs(m)
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
	// Other columns are empty when all zero (broker.proto): check the
	// lengths here; at reads them as zero when empty.
	for _, col := range []struct {
		name string
		l    int
	}{
		{"provider", len(c.Provider)}, {"accelerator", len(c.Accelerator)}, {"gpu_count", len(c.GpuCount)},
		{"price_per_hour", len(c.PricePerHour)}, {"online", len(c.Online)}, {"last_seen_unix_nano", len(c.LastSeenUnixNano)},
		{"rtt_ms", len(c.RttMs)}, {"simulated", len(c.Simulated)}, {"conformance_passed", len(c.ConformancePassed)},
		{"out_of_scope", len(c.OutOfScope)}, {"score", len(c.Score)}, {"latency_ms", len(c.LatencyMs)},
		{"latency_used_ms", len(c.LatencyUsedMs)}, {"latency_cap_ms", len(c.LatencyCapMs)}, {"latency_penalty", len(c.LatencyPenalty)},
		{"failure_rate_pct", len(c.FailureRatePct)}, {"launches_24h", len(c.Launches_24H)}, {"launch_failures_24h", len(c.LaunchFailures_24H)},
		{"failure_penalty", len(c.FailurePenalty)}, {"class_mean_price", len(c.ClassMeanPrice)}, {"price_premium_pct", len(c.PricePremiumPct)},
		{"price_penalty", len(c.PricePenalty)}, {"reason_count", len(c.ReasonCount)},
	} {
		if col.l != 0 && col.l != n {
			return nil, nil, fmt.Errorf("column %s has %d entries for %d nodes", col.name, col.l, n)
		}
	}
	var err error
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
	// One array for every node's reasons, not one each.
	arena := make([]*gpupassv1.Reason, len(refs))
	for i := 0; i < n; i++ {
		p := &ns[i]
		nodes[i] = p
		p.Id = c.Id[i]
		if p.Region, err = str("region", c.Region[i]); err != nil {
			return nil, nil, err
		}
		if k := int(at(c.ReasonCount, i)); k > 0 {
			if k > len(refs) {
				return nil, nil, fmt.Errorf("node %s has %d reasons, %d references left", p.Id, k, len(refs))
			}
			rs := arena[:k:k]
			arena = arena[k:]
			for j, ref := range refs[:k] {
				if int(ref) >= len(table) {
					return nil, nil, fmt.Errorf("node %s refers to reason %d of %d", p.Id, ref, len(table))
				}
				rs[j] = table[ref]
			}
			reasons[i] = rs
			refs = refs[k:]
		}
		if at(c.OutOfScope, i) {
			continue
		}
		if p.Provider, err = str("provider", at(c.Provider, i)); err != nil {
			return nil, nil, err
		}
		if p.Accelerator, err = str("accelerator", at(c.Accelerator, i)); err != nil {
			return nil, nil, err
		}
		p.GpuCount, p.PricePerHour, p.Online, p.LastSeenUnixNano = at(c.GpuCount, i), at(c.PricePerHour, i), at(c.Online, i), at(c.LastSeenUnixNano, i)
		p.RttMs, p.Simulated, p.ConformancePassed = at(c.RttMs, i), at(c.Simulated, i), at(c.ConformancePassed, i)
		h := &hs[i]
		p.Health = h
		if c.ScoreTermsDerived {
			// The broker left the terms out: they follow from these
			// columns by the broker's own formula (broker.proto).
			health.Compute(p.RttMs, c.DerivedLatencyCapMs, at(c.Launches_24H, i), at(c.LaunchFailures_24H, i), p.PricePerHour, at(c.ClassMeanPrice, i)).Fill(h)
			continue
		}
		h.Score, h.LatencyMs, h.LatencyUsedMs, h.LatencyCapMs, h.LatencyPenalty = at(c.Score, i), at(c.LatencyMs, i), at(c.LatencyUsedMs, i), at(c.LatencyCapMs, i), at(c.LatencyPenalty, i)
		h.FailureRatePct, h.Launches_24H, h.LaunchFailures_24H, h.FailurePenalty = at(c.FailureRatePct, i), at(c.Launches_24H, i), at(c.LaunchFailures_24H, i), at(c.FailurePenalty, i)
		h.ClassMeanPrice, h.PricePremiumPct, h.PricePenalty = at(c.ClassMeanPrice, i), at(c.PricePremiumPct, i), at(c.PricePenalty, i)
	}
	if len(refs) > 0 {
		return nil, nil, fmt.Errorf("%d reason references left over", len(refs))
	}
	return nodes, reasons, nil
}

// at returns col[i], or the zero value when col was sent empty (all
// zero); expandColumns has checked that every other column is full.
func at[T any](col []T, i int) T {
	if len(col) == 0 {
		var zero T
		return zero
	}
	return col[i]
}

// expandRefs resolves the reason_refs of an inline answer's excluded
// nodes against its reason table, then drops the references and the table.
func expandRefs(m *gpupassv1.DryRunResponse) error {
	total := 0
	for _, x := range m.Excluded {
		total += len(x.ReasonRefs)
	}
	if total == 0 {
		return nil
	}
	// One array for every node's reasons, cut per node.
	all := make([]*gpupassv1.Reason, 0, total)
	for i, x := range m.Excluded {
		start := len(all)
		for _, ref := range x.ReasonRefs {
			if int(ref) >= len(m.Reasons) {
				return fmt.Errorf("dry-run answer: excluded node %d refers to reason %d of %d", i, ref, len(m.Reasons))
			}
			all = append(all, m.Reasons[ref])
		}
		x.Reasons = append(x.Reasons, all[start:len(all):len(all)]...)
		x.ReasonRefs = nil
	}
	m.Reasons = nil
	return nil
}
