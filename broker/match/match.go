// Package match decides which registered nodes can run a spec, and scores
// them. It is pure: the broker hands it the registry snapshot, launch
// statistics, the caller's scope and filters, and the time.
//
// Health score (DESIGN §3), every term kept in health.Score:
//
//	score = min(100, 100 - 0.1*latency_ms - 5*failure_rate_pct_24h - 2*price_premium_pct)
//
// latency_ms is the broker↔agent RTT from heartbeats, capped at the spec's
// network.latency_tolerance_ms when set (0 when not measured yet);
// failure_rate_pct_24h is failed launches over launches in the last 24 h
// (0 with no launches); price_premium_pct is the node's price against the
// mean price per hour of every node with a report of the same accelerator
// class (negative when cheaper, which can lift the score to the cap).
package match

import (
	"fmt"
	"math"
	"path"
	"strconv"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/health"
	"github.com/gpupass/gpupass/internal/spec"
)

// DefaultMinScore is the threshold when the caller sets none.
const DefaultMinScore = 85.0

// MaxPricePerHour bounds the price per hour a node may declare (the
// broker refuses more at enrollment and in reports). No GPU node costs
// near it, and under it the sum of any fleet's prices stays finite.
const MaxPricePerHour = 1e6

// Reason codes (stable: clients and tests match on them).
const (
	CodeRuntimeMismatch   = "runtime_mismatch"
	CodeResourceMismatch  = "resource_mismatch"
	CodeScoreBelow        = "score_below_threshold"
	CodeRegionFilter      = "region_filter"
	CodeRegionScope       = "region_scope"
	CodePriceAboveMax     = "price_above_max"
	CodeOffline           = "offline"
	CodeNoReport          = "no_report"
	CodeConformanceFailed = "conformance_failed"
	// CodeAdmission: the node is pending admission or denied it
	// (gpupass-broker serve --admission); Measured says which.
	CodeAdmission = "admission"
)

// Reason is why a node was excluded.
type Reason struct {
	Code     string `json:"code"`
	Field    string `json:"field,omitempty"`
	Expected string `json:"expected,omitempty"`
	Measured string `json:"measured,omitempty"`
	Message  string `json:"message"`
}

// Result is one node's verdict.
type Result struct {
	Node       store.Node
	Online     bool
	OutOfScope bool
	Score      health.Score
	Reasons    []Reason
}

// Price is the node's price per hour: the signed report's, else its label.
func Price(n *store.Node) float64 {
	if n.HasReport && n.Index.PricePerHour > 0 {
		return n.Index.PricePerHour
	}
	return n.Labels.PricePerHour
}

// Region is the node's region: the signed report's, else its label.
func Region(n *store.Node) string {
	if n.HasReport && n.Index.Region != "" {
		return n.Index.Region
	}
	return n.Labels.Region
}

// MatchRegion reports whether region matches any glob pattern.
func MatchRegion(patterns []string, region string) bool {
	for _, p := range patterns {
		if ok, err := path.Match(p, region); err == nil && ok {
			return true
		}
	}
	return false
}

// Input is everything a match needs.
type Input struct {
	// Spec may be nil: then only scope, filters, liveness and score apply
	// (node listing).
	Spec  *spec.Spec
	Nodes []store.Node
	// Launches are launch statistics over the last 24 h per node id.
	Launches map[string]store.LaunchStats
	// Scope are the caller token's region patterns.
	Scope []string
	// Regions filter nodes further; empty means no filter.
	Regions []string
	// MinScore is the threshold (applied only with a Spec).
	MinScore float64
	// MaxPrice per hour; 0 means no limit.
	MaxPrice float64
	// Beat, when set, returns a heartbeat newer than the store may hold
	// (the broker's own, before it is flushed); newer ones win.
	Beat func(id string) (store.Heartbeat, bool)
	// Now and OfflineAfter decide liveness.
	Now          time.Time
	OfflineAfter time.Duration
	// Held are nodes (by id) that may take no run, with why (their
	// admission, decided by the broker).
	Held map[string]Reason
}

// Output is the verdicts: candidates by score (then price, then id), then
// excluded nodes (in scope by score then id, out of scope last).
type Output struct {
	Candidates []*Result
	Excluded   []*Result
}

// Run matches and scores every node. It is Prepare and Match in one, with
// the verdicts written out in full; callers that match one registry often
// keep the Index.
func Run(in Input) Output {
	ix := PrepareHeld(in.Nodes, in.Launches, in.Held)
	vs := ix.Match(Query{Spec: in.Spec, Scope: in.Scope, Regions: in.Regions, MinScore: in.MinScore, MaxPrice: in.MaxPrice,
		Beat: in.Beat, Now: in.Now, OfflineAfter: in.OfflineAfter, Held: in.Held})
	return Output{Candidates: vs.results(vs.Candidates), Excluded: vs.results(vs.Excluded)}
}

// results writes verdicts out as Results (the node copied with its newest
// liveness, the reasons spelled out).
func (vs *Verdicts) results(list []Verdict) []*Result {
	all := make([]Result, len(list))
	out := make([]*Result, len(list))
	for i := range list {
		v, r := &list[i], &all[i]
		r.Node, r.Online, r.OutOfScope, r.Score = vs.ix.nodes[v.Node], v.Online, v.OutOfScope, vs.Terms(v)
		r.Node.LastSeen, r.Node.RTTMS = v.LastSeenTime(), v.RTTMS
		if why := vs.Why(v); len(why) > 0 {
			r.Reasons = make([]Reason, len(why))
			for j, id := range why {
				r.Reasons[j] = vs.Reasons[id]
			}
		}
		out[i] = r
	}
	return out
}

// classMeans are the mean prices per accelerator class, of the nodes
// not held: a node pending admission must not move the premium, and so
// the score, of the nodes that may take runs.
func classMeans(nodes []store.Node, held map[string]Reason) map[string]float64 {
	sum := map[string]float64{}
	cnt := map[string]int{}
	for i := range nodes {
		n := &nodes[i]
		if !n.HasReport || n.Index.Accelerator == "" {
			continue
		}
		if _, ok := held[n.ID]; ok {
			continue
		}
		// A price out of bounds (stored before the broker refused them)
		// is left out: one near MaxFloat64 would overflow the sum, and
		// an infinite mean makes every other premium NaN.
		if p := Price(n); p > 0 && p <= MaxPricePerHour {
			sum[n.Index.Accelerator] += p
			cnt[n.Index.Accelerator]++
		}
	}
	means := map[string]float64{}
	for k, s := range sum {
		means[k] = s / float64(cnt[k])
	}
	return means
}

func runtimeMismatches(sp *spec.Spec, ix store.NodeIndex) []Reason {
	var rs []Reason
	for _, d := range conformance.DeclaredVersions(sp, &ix.Runtime) {
		if d.Met() {
			continue
		}
		got := d.Measured
		if got == "" {
			got = "(not found)"
		}
		rs = append(rs, Reason{Code: CodeRuntimeMismatch, Field: d.Field, Expected: d.Expected, Measured: got,
			Message: fmt.Sprintf("%s: expected %s, measured %s", d.Field, d.Expected, got)})
	}
	if sp.Security.FIPSCompliant && !ix.Runtime.FIPSEnabled {
		rs = append(rs, Reason{Code: CodeRuntimeMismatch, Field: "security.fips-compliant", Expected: "true", Measured: "false",
			Message: "security.fips-compliant: expected FIPS mode enabled, measured disabled"})
	}
	return rs
}

// storageRank orders storage classes: a better class satisfies a lesser one.
var storageRank = map[string]int{"standard": 1, "high-iops-nvme": 2, "ultra-nvme": 3}

func resourceMismatches(sp *spec.Spec, ix store.NodeIndex) []Reason {
	var rs []Reason
	add := func(field, want, got, msg string) {
		rs = append(rs, Reason{Code: CodeResourceMismatch, Field: field, Expected: want, Measured: got, Message: field + ": " + msg})
	}
	res := sp.Resources
	if res.Accelerator != "" && res.Accelerator != ix.Accelerator {
		add("resources.accelerator", res.Accelerator, orNone(ix.Accelerator), fmt.Sprintf("expected %s, measured %s", res.Accelerator, orNone(ix.Accelerator)))
	}
	switch g := ix.GresGPUs; {
	case res.Count > 0 && g != nil && *g < res.Count:
		// A job on a Slurm node gets its GRES, not what it has.
		add("resources.count", ">= "+strconv.Itoa(res.Count), "gres "+strconv.Itoa(*g),
			fmt.Sprintf("expected at least %d GPUs, the slurm node's GRES gives a job %d", res.Count, *g))
	case res.Count > 0 && ix.GPUCount < res.Count:
		add("resources.count", ">= "+strconv.Itoa(res.Count), strconv.Itoa(ix.GPUCount), fmt.Sprintf("expected at least %d GPUs, measured %d", res.Count, ix.GPUCount))
	}
	if want := res.Storage.Type; want != "" {
		wr, known := storageRank[want]
		gr := storageRank[ix.StorageClass]
		if (known && gr < wr) || (!known && want != ix.StorageClass) {
			add("resources.storage.type", want, orNone(ix.StorageClass), fmt.Sprintf("expected %s or better, node has %s", want, orNone(ix.StorageClass)))
		}
	}
	if res.Storage.SizeGB > 0 && ix.StorageFreeGB < float64(res.Storage.SizeGB) {
		add("resources.storage.size_gb", ">= "+strconv.Itoa(res.Storage.SizeGB), num(ix.StorageFreeGB),
			fmt.Sprintf("expected at least %d GB free, measured %s GB", res.Storage.SizeGB, num(ix.StorageFreeGB)))
	}
	if bw := res.Network.BandwidthGbps; bw > 0 && ix.BandwidthGbps < bw {
		add("resources.network.bandwidth_gbps", ">= "+num(bw), num(ix.BandwidthGbps),
			fmt.Sprintf("expected at least %s Gbps, node has %s Gbps", num(bw), num(ix.BandwidthGbps)))
	}
	return rs
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func num(f float64) string { return strconv.FormatFloat(math.Round(f*100)/100, 'f', -1, 64) }
