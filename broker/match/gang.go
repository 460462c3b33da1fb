package match

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
)

// Gang is a set of nodes of one region that together hold a spec's
// resources.count GPUs, the same number on each: every node a candidate
// for its share (the spec with count/len(Nodes) GPUs: runtime, storage,
// bandwidth, health score, price), all with the same accelerator class
// and the same runtime (driver, CUDA, Python, PyTorch, FIPS), so that
// every rank runs in one certified environment.
type Gang struct {
	Region      string
	Accelerator string
	GPUsPerNode int
	// Nodes are Index node indexes, best first (the match's order).
	Nodes []int32
}

// GangMiss says why a region has no gang for a spec.
type GangMiss struct {
	Region string
	Reason string
}

// Gangs is the outcome of a gang match: the best gang of each region
// that has one, and why the others have none, each by region name.
type Gangs struct {
	Found  []Gang
	Missed []GangMiss
}

// NodeCounts are the gang sizes a spec may be placed on, fewest first:
// exactly resources.nodes when it is more than 1, none when it is 1;
// left out, every divisor of resources.count from 2 up (the broker
// chooses the fewest nodes whose GPUs add up evenly).
func NodeCounts(sp *spec.Spec) []int {
	if sp == nil {
		return nil
	}
	r := sp.Resources
	switch {
	case r.Nodes == 1:
		return nil
	case r.Nodes > 1:
		if r.Count < r.Nodes || r.Count%r.Nodes != 0 {
			return nil
		}
		return []int{r.Nodes}
	}
	var ks []int
	for k := 2; k <= r.Count && k <= spec.MaxNodes; k++ {
		if r.Count%k == 0 {
			ks = append(ks, k)
		}
	}
	return ks
}

// MaxGangSizes bounds the gang sizes one dry-run tries, each a match over
// the whole registry: with count left out, every divisor of a count like
// 720720 up to MaxNodes would be hundreds of them.
const MaxGangSizes = 16

// gangSizes are the sizes of NodeCounts worth a match: those whose share
// of the GPUs some indexed node has (a share above every node's count
// can match none), the fewest nodes first, at most MaxGangSizes.
func (ix *Index) gangSizes(sp *spec.Spec) []int {
	ks := NodeCounts(sp)
	if len(ks) == 0 {
		return nil
	}
	var out []int
	for _, k := range ks {
		if sp.Resources.Count/k <= int(ix.maxGPUs) && len(out) < MaxGangSizes {
			out = append(out, k)
		}
	}
	return out
}

// PerNode is sp as each of k nodes of a gang must match it: its share
// of the GPUs, the rest unchanged.
func PerNode(sp *spec.Spec, k int) *spec.Spec {
	c := *sp
	c.Resources.Count = sp.Resources.Count / k
	c.Resources.Nodes = 0
	return &c
}

// ListedSpec is the spec a dry-run matches its listed nodes with: one
// node's share of the GPUs when sp asks for resources.nodes > 1, else sp.
func ListedSpec(sp *spec.Spec) *spec.Spec {
	if NeedsGang(sp) {
		return PerNode(sp, sp.Resources.Nodes)
	}
	return sp
}

// NeedsGang reports whether sp asks for more than one node in so many
// words (resources.nodes > 1). Such a run cannot go to one node.
func NeedsGang(sp *spec.Spec) bool { return sp != nil && sp.Resources.Nodes > 1 }

// gangStage is one requirement a gang's nodes must meet, in the order a
// miss is explained: the first that leaves fewer nodes than the gang
// needs is the reason.
type gangStage struct {
	has  func(r Reason) bool // the reason that fails it
	verb [2]string           // singular, plural
}

// certifiedCodes fail a node before any requirement of the spec: it is
// not a certified node of the accelerator class at all.
var certifiedCodes = []string{CodeNoReport, CodeConformanceFailed, CodeOffline, CodeAdmission}

func gangStages(per *spec.Spec, minScore, maxPrice float64) []gangStage {
	field := func(prefix string) func(Reason) bool {
		return func(r Reason) bool { return r.Code == CodeResourceMismatch && strings.HasPrefix(r.Field, prefix) }
	}
	code := func(c string) func(Reason) bool { return func(r Reason) bool { return r.Code == c } }
	return []gangStage{
		{code(CodeRuntimeMismatch), [2]string{"matches the spec's runtime", "match the spec's runtime"}},
		{field("resources.count"), [2]string{"has ≥ " + count(per.Resources.Count, "GPUs"), "have ≥ " + count(per.Resources.Count, "GPUs")}},
		{field("resources.storage"), [2]string{"has the storage asked for", "have the storage asked for"}},
		{field("resources.network.bandwidth_gbps"), [2]string{"has ≥ " + num(per.Resources.Network.BandwidthGbps) + " Gbit/s", "have ≥ " + num(per.Resources.Network.BandwidthGbps) + " Gbit/s"}},
		{code(CodeScoreBelow), [2]string{"scores ≥ " + num(minScore), "score ≥ " + num(minScore)}},
		{code(CodePriceAboveMax), [2]string{"costs ≤ " + num(maxPrice) + "/h", "cost ≤ " + num(maxPrice) + "/h"}},
		{func(Reason) bool { return true }, [2]string{"may take the run", "may take the run"}},
	}
}

// gangKey is what every node of a gang shares: its region, runtime and
// accelerator, and its site. The nodes of a Slurm cluster (provider
// slurm:CLUSTER) run a gang as one batch job of their one agent, and the
// nodes of a Kubernetes cluster (jobs reached at their pod's IP,
// rendezvous.PodAddress) reach each other's pods within that cluster
// only: each forms gangs only with its own cluster's nodes. A node whose
// jobs the others reach at the address it advertises (the local
// executor) has no site (-1).
type gangKey struct{ region, runtime, accel, site int32 }

// gangKeyOf is node n's gangKey.
func (ix *Index) gangKeyOf(n int32) gangKey {
	e := &ix.ent[n]
	site := int32(-1)
	if strings.HasPrefix(ix.names[e.provider], SlurmProviderPrefix) || ix.nodes[n].Labels.JobAddress == rendezvous.PodAddress {
		site = e.provider
	}
	return gangKey{e.region, e.runtime, e.accel, site}
}

// SlurmProviderPrefix starts the provider of a Slurm cluster's nodes
// (slurm:CLUSTER, the agent's --executor slurm).
const SlurmProviderPrefix = "slurm:"

// Gangs finds, for each region in q's scope and filter, the best gang of
// the fewest nodes (NodeCounts) that runs q.Spec, and, when the spec
// asks for resources.nodes > 1, for each region without one says why.
// Without resources.nodes, a region where one node holds the whole count
// needs no gang and is left out. q.Spec nil or asking for one node gives
// nothing.
//
// listed, when not nil, is the match a dry-run lists (ListedSpec's): of
// q.Spec, or of one node's share with resources.nodes > 1. Gangs reads it
// instead of matching again and leaves it to the caller to release. A
// spec that asks for resources.nodes then costs no match of its own, and
// one without it a match per gang size only when some region has no node
// that holds the count.
func (ix *Index) Gangs(q Query, listed *Verdicts) Gangs {
	var out Gangs
	ks := ix.gangSizes(q.Spec)
	if len(ks) == 0 {
		return out
	}
	explicit := NeedsGang(q.Spec)
	if listed == nil {
		lq := q
		lq.Spec = ListedSpec(q.Spec)
		m := ix.Match(lq)
		defer m.Release()
		listed = &m
	}
	// The regions asked about (the token's scope and the filter, as the
	// match decides them), and (without resources.nodes) those where one
	// node holds the count: with one in every region asked about, there
	// is nothing to find, at no cost beyond this pass.
	regions := map[int32]bool{}
	for _, r := range ix.regions {
		if name := ix.names[r]; MatchRegion(q.Scope, name) && (len(q.Regions) == 0 || MatchRegion(q.Regions, name)) {
			regions[r] = true
		}
	}
	// Slices by region name, not maps: a fleet's candidates are most of
	// its nodes, and this pass is all most dry-runs pay for gangs.
	single := make([]bool, len(ix.names))
	if !explicit {
		nSingle := 0
		for i := 0; i < len(listed.Candidates) && nSingle < len(regions); i++ {
			if r := ix.ent[listed.Candidates[i].Node].region; !single[r] {
				single[r] = true
				nSingle++
			}
		}
		if nSingle >= len(regions) {
			return out
		}
	}
	found := map[int32]Gang{}
	type near struct {
		stage int
		msg   string
	}
	nearest := map[int32]near{}
	for _, k := range ks {
		per := PerNode(q.Spec, k)
		vs := listed
		if !explicit {
			pq := q
			pq.Spec = per
			m := ix.Match(pq)
			vs = &m
		}
		groups := map[gangKey][]int32{}
		for i := range vs.Candidates {
			n := vs.Candidates[i].Node
			e := &ix.ent[n]
			if !regions[e.region] || single[e.region] {
				continue
			}
			if _, done := found[e.region]; done {
				continue
			}
			key := ix.gangKeyOf(n)
			groups[key] = append(groups[key], n)
			if len(groups[key]) == k {
				found[e.region] = Gang{Region: ix.names[e.region], Accelerator: ix.names[e.accel], GPUsPerNode: per.Resources.Count, Nodes: groups[key]}
			}
		}
		// Without resources.nodes the spec asked for no gang: a region
		// that has none is a region without a candidate, as before.
		for r := range regions {
			if _, done := found[r]; done || !explicit {
				continue
			}
			stage, msg := ix.gangMiss(vs, r, k, per, q.MinScore, q.MaxPrice)
			if old, ok := nearest[r]; !ok || stage > old.stage {
				nearest[r] = near{stage, msg}
			}
		}
		if vs != listed {
			vs.Release()
		}
	}
	for _, g := range found {
		out.Found = append(out.Found, g)
	}
	for r, n := range nearest {
		if _, ok := found[r]; !ok {
			out.Missed = append(out.Missed, GangMiss{Region: ix.names[r], Reason: n.msg})
		}
	}
	slices.SortFunc(out.Found, func(a, b Gang) int { return strings.Compare(a.Region, b.Region) })
	slices.SortFunc(out.Missed, func(a, b GangMiss) int { return strings.Compare(a.Region, b.Region) })
	return out
}

// gangMiss explains why region has no gang of k nodes in vs (a match of
// per, the spec's share of one node): how many certified nodes of the
// accelerator class it has, and the first requirement that leaves fewer
// than k of them. The stage returned orders explanations: a higher one
// got further.
func (ix *Index) gangMiss(vs *Verdicts, region int32, k int, per *spec.Spec, minScore, maxPrice float64) (int, string) {
	accel := per.Resources.Accelerator
	class := "certified " + accel + " nodes"
	if accel == "" {
		class = "certified nodes"
	}
	// left are the region's certified nodes of the class, each with its
	// reasons; a stage keeps those without its reason.
	var left [][]Reason
	// offline are the certified nodes of the class that are offline and
	// nothing else: a gang that misses only them says so, since they
	// would count once back.
	offline := 0
	for _, list := range [][]Verdict{vs.Candidates, vs.Excluded} {
		for i := range list {
			v := &list[i]
			if v.OutOfScope || ix.ent[v.Node].region != region {
				continue
			}
			why := vs.Why(v)
			rs := make([]Reason, len(why))
			for j, id := range why {
				rs[j] = vs.Reasons[id]
			}
			if slices.ContainsFunc(rs, func(r Reason) bool {
				return slices.Contains(certifiedCodes, r.Code) || r.Code == CodeRegionFilter || r.Field == "resources.accelerator"
			}) {
				if !slices.ContainsFunc(rs, func(r Reason) bool {
					return r.Code != CodeOffline && (slices.Contains(certifiedCodes, r.Code) || r.Code == CodeRegionFilter || r.Field == "resources.accelerator")
				}) {
					offline++
				}
				continue
			}
			left = append(left, rs)
		}
	}
	online := ""
	if offline > 0 {
		online = fmt.Sprintf(" online (%d offline)", offline)
	}
	if len(left) == 0 {
		return 0, fmt.Sprintf("no %s%s, a gang needs %d", strings.TrimSuffix(class, "s"), online, k)
	}
	if len(left) < k {
		return 0, fmt.Sprintf("only %s%s, a gang needs %d", count(len(left), class), online, k)
	}
	total := len(left)
	var met []string // the requirements that narrowed the nodes so far
	for s, st := range gangStages(per, minScore, maxPrice) {
		var kept [][]Reason
		for _, rs := range left {
			if !slices.ContainsFunc(rs, st.has) {
				kept = append(kept, rs)
			}
		}
		if len(kept) < k {
			verb := st.verb[1]
			only := "only " + strconv.Itoa(len(kept))
			if len(kept) <= 1 {
				verb = st.verb[0]
			}
			if len(kept) == 0 {
				only = "none"
			}
			so := ""
			if len(met) > 0 {
				so = fmt.Sprintf(", %d of them %s", len(left), strings.Join(met, " and "))
			}
			return s + 1, fmt.Sprintf("%s%s, but %s %s (a gang needs %d)", count(total, class), so, only, verb, k)
		}
		if len(kept) < len(left) {
			met = append(met, st.verb[1])
		}
		left = kept
	}
	// Enough nodes meet every requirement, but not k of them share an
	// accelerator and a runtime.
	return len(gangStages(per, minScore, maxPrice)) + 1,
		fmt.Sprintf("%s qualify, but no %d of them share one runtime (driver, CUDA, Python, PyTorch)", count(len(left), class), k)
}

// count is "1 certified a100 node" or "3 certified a100 nodes".
func count(n int, plural string) string {
	if n == 1 {
		return "1 " + strings.TrimSuffix(plural, "s")
	}
	return strconv.Itoa(n) + " " + plural
}
