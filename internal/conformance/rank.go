package conformance

import (
	"fmt"
	"sort"
	"strings"
)

// A run across several nodes is certified only when every rank ran the
// declared environment: each rank's signed run report must have measured
// the spec's fingerprint on the accelerator rank 0 measured. The broker
// (GetRunEvidence) and `gpupass audit verify` both ask RankProblem, so
// the rule lives here once.

// Accelerator is the accelerator a report measured: its GPUs' classes
// (their names where a class is unknown), "2 × h100-sxm5"; "no GPU" when
// it measured none.
func Accelerator(r *Report) string {
	count := map[string]int{}
	for _, g := range r.GPUs {
		k := g.Class
		if k == "" {
			k = g.Name
		}
		count[k]++
	}
	if len(count) == 0 {
		return "no GPU"
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d × %s", count[k], k)
	}
	return strings.Join(parts, ", ")
}

// RankProblem says why rank's signed run report r keeps its run from
// being certified against the spec fingerprint specFP, with head rank 0's
// report (nil for rank 0 itself); "" when it does not. The reason names
// the rank and its agent: "rank 1 on agt-…: measured runtime fingerprint
// sha256:… , the spec declares sha256:…".
func RankProblem(rank int, head, r *Report, specFP string) string {
	who := fmt.Sprintf("rank %d on %s", rank, r.AgentID)
	switch {
	case r.RuntimeFingerprint == "":
		return who + ": its signed run report carries no runtime fingerprint"
	case r.RuntimeFingerprint != specFP:
		return fmt.Sprintf("%s: measured runtime fingerprint %s, the spec declares %s", who, r.RuntimeFingerprint, specFP)
	}
	if head != nil && rank > 0 {
		if got, want := Accelerator(r), Accelerator(head); got != want {
			return fmt.Sprintf("%s: measured accelerator %s, rank 0 measured %s", who, got, want)
		}
	}
	return ""
}
