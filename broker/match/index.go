package match

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/health"
	"github.com/gpupass/gpupass/internal/spec"
)

// Index is a registry snapshot prepared for matching. Everything that
// depends neither on the spec nor on the caller is computed once here: the
// price and failure terms of the score, each node's region, and its match
// keys (the distinct runtime and resource values a spec is compared with).
// A match then compares a spec with each distinct key once and, per node,
// only looks up its keys and adds up its score. An Index is read-only once
// built and may be shared by concurrent matches.
type Index struct {
	nodes []store.Node
	ent   []entry
	live  []liveness
	// byID are the node indexes in node id order.
	byID []int32
	// ids are the node ids, copied into one string: an answer writes out
	// every id, and reading 10,000 strings spread over the heap cost a
	// cache miss each.
	ids []string
	// names are the distinct regions, providers and accelerator classes.
	names    []string
	runtimes []runtimeKey
	res      []resourceKey
	// regions are the distinct regions of the nodes, as indexes into
	// names (a gang match goes region by region); maxGPUs is the most
	// GPUs a node's report has (no gang share above it can match).
	regions []int32
	maxGPUs int32
}

type entry struct {
	region   int32 // into names
	provider int32 // into names
	accel    int32 // into names
	runtime  int32 // into runtimes
	resource int32 // into res
	price    float64
	// Inputs of the health score besides latency.
	launches, failures int64
	classMean          float64
	// hasReport, passed, gpus and simulated are the node's, kept here for
	// the match and the short form of an answer: reading them from each
	// store.Node costs a cache miss per node (records and their strings
	// lie all over the heap), most of a 10,000-node answer's encoding.
	hasReport, passed, simulated bool
	gpus                         int32
}

// liveness is a node's last heartbeat (unix nanoseconds, 0: never) and
// RTT as the snapshot holds them, kept apart from the nodes' records so
// that a match reads 16 bytes a node, and renewed by WithNodes.
type liveness struct {
	at  int64
	rtt float64
}

// unixNano is t in unix nanoseconds, 0 for the zero time (never).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func livenessOf(nodes []store.Node) []liveness {
	l := make([]liveness, len(nodes))
	for i := range nodes {
		l[i] = liveness{unixNano(nodes[i].LastSeen), nodes[i].RTTMS}
	}
	return l
}

// runtimeKey is what a spec's runtime and security sections are compared
// with, and whether there is anything to compare.
type runtimeKey struct {
	hasReport, passed             bool
	driver, cuda, python, pytorch string
	fips                          bool
}

// resourceKey is what a spec's resources section is compared with.
type resourceKey struct {
	hasReport     bool
	accelerator   string
	count         int
	storageClass  string
	freeGB, bwGbs float64
	gres          int // a Slurm node's GRES GPU count; -1: none stated
}

// Prepare indexes nodes and their launch statistics over the last 24 h.
// The Index keeps nodes (it does not copy them): do not modify them after.
func Prepare(nodes []store.Node, launches map[string]store.LaunchStats) *Index {
	return PrepareHeld(nodes, launches, nil)
}

// PrepareHeld is Prepare where the nodes in held (by id) may take no run:
// their prices stay out of their class's mean price. Matches against the
// Index must hold them too (Query.Held).
func PrepareHeld(nodes []store.Node, launches map[string]store.LaunchStats, held map[string]Reason) *Index {
	ix := &Index{nodes: nodes, ent: make([]entry, len(nodes)), live: livenessOf(nodes)}
	means := classMeans(nodes, held)
	nameID := map[string]int32{}
	name := func(s string) int32 {
		id, ok := nameID[s]
		if !ok {
			id = int32(len(ix.names))
			nameID[s] = id
			ix.names = append(ix.names, s)
		}
		return id
	}
	var seenRegion []bool // by name index
	rtID := map[runtimeKey]int32{}
	resID := map[resourceKey]int32{}
	for i := range nodes {
		n := &nodes[i]
		e := &ix.ent[i]
		e.region = name(Region(n))
		if int(e.region) >= len(seenRegion) {
			seenRegion = append(seenRegion, make([]bool, int(e.region)+1-len(seenRegion))...)
		}
		if !seenRegion[e.region] {
			seenRegion[e.region] = true
			ix.regions = append(ix.regions, e.region)
		}
		if n.HasReport {
			e.provider, e.accel = name(n.Index.Provider), name(n.Index.Accelerator)
		} else {
			e.provider, e.accel = name(n.Labels.Provider), name("")
		}
		rk := runtimeKey{hasReport: n.HasReport}
		sk := resourceKey{hasReport: n.HasReport, gres: -1}
		if n.HasReport {
			r := &n.Index.Runtime
			// A node whose failed checks the index knows gets each as a
			// reason of its own (failedWhy), not the generic one.
			passed := n.Index.Passed || len(n.Index.FailedChecks) > 0
			rk = runtimeKey{true, passed, r.NvidiaDriver, r.CUDA, r.Python, r.PyTorch, r.FIPSEnabled}
			sk = resourceKey{true, n.Index.Accelerator, n.Index.GPUCount, n.Index.StorageClass, n.Index.StorageFreeGB, n.Index.BandwidthGbps, -1}
			if g := n.Index.GresGPUs; g != nil {
				sk.gres = *g
			}
		}
		var ok bool
		if e.runtime, ok = rtID[rk]; !ok {
			e.runtime = int32(len(ix.runtimes))
			rtID[rk] = e.runtime
			ix.runtimes = append(ix.runtimes, rk)
		}
		if e.resource, ok = resID[sk]; !ok {
			e.resource = int32(len(ix.res))
			resID[sk] = e.resource
			ix.res = append(ix.res, sk)
		}
		e.price, e.hasReport, e.passed = Price(n), n.HasReport, n.HasReport && n.Index.Passed
		if n.HasReport {
			e.gpus, e.simulated = int32(n.Index.GPUCount), n.Index.Simulated
			ix.maxGPUs = max(ix.maxGPUs, e.gpus)
		}
		ls := launches[n.ID]
		e.launches, e.failures = ls.Launches, ls.Failures
		if n.HasReport {
			e.classMean = means[n.Index.Accelerator]
		}
	}
	order := make([]int32, len(nodes))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return strings.Compare(nodes[a].ID, nodes[b].ID) })
	ix.byID = order
	size := 0
	for i := range nodes {
		size += len(nodes[i].ID)
	}
	var all strings.Builder
	all.Grow(size)
	for i := range nodes {
		all.WriteString(nodes[i].ID)
	}
	ix.ids = make([]string, len(nodes))
	joined, off := all.String(), 0
	for i := range nodes {
		ix.ids[i] = joined[off : off+len(nodes[i].ID)]
		off += len(nodes[i].ID)
	}
	return ix
}

// WithNodes returns the Index over nodes, which must be the indexed nodes
// in the same order with only their liveness (LastSeen, RTTMS) changed:
// a refresh that saw only heartbeats keeps every key and score term.
func (ix *Index) WithNodes(nodes []store.Node) *Index {
	c := *ix
	c.nodes = nodes
	// The registry hands the same array back when nothing moved (every
	// refresh of a quiet fleet): its liveness is the one read already.
	if len(nodes) != len(ix.nodes) || len(nodes) == 0 || &nodes[0] != &ix.nodes[0] {
		c.live = livenessOf(nodes)
	}
	return &c
}

// Names are the distinct region, provider and accelerator names of the
// indexed nodes, which NameIDs refer to. Do not modify them.
func (ix *Index) Names() []string { return ix.names }

// NameIDs returns node i's provider, region and accelerator class (its
// report's, else its labels') as indexes into Names.
func (ix *Index) NameIDs(i int32) (provider, region, accelerator uint32) {
	e := &ix.ent[i]
	return uint32(e.provider), uint32(e.region), uint32(e.accel)
}

// Short returns what the short form of node i says besides its names,
// price and liveness: its report's GPU count and simulated flag (0 and
// false without a report) and whether its report passed.
func (ix *Index) Short(i int32) (gpus int32, simulated, passed bool) {
	e := &ix.ent[i]
	return e.gpus, e.simulated, e.passed
}

// Price returns node i's price per hour (see Price).
func (ix *Index) Price(i int32) float64 { return ix.ent[i].price }

// ID returns node i's id (as Node(i).ID, kept close to the others).
func (ix *Index) ID(i int32) string { return ix.ids[i] }

// Len is the number of indexed nodes.
func (ix *Index) Len() int { return len(ix.nodes) }

// ByID returns the node indexes in node id order (shared: do not modify).
func (ix *Index) ByID() []int32 { return ix.byID }

// Node returns indexed node i as stored (without newer heartbeats).
func (ix *Index) Node(i int32) *store.Node { return &ix.nodes[i] }

// Query is one match against an Index: the Input of Run without the nodes.
type Query struct {
	Spec     *spec.Spec
	Scope    []string
	Regions  []string
	MinScore float64
	MaxPrice float64
	Beat     func(id string) (store.Heartbeat, bool)
	// Live, when set, holds each indexed node's newest heartbeat in index
	// order, and Beat is not asked: a broker reads the whole registry's
	// under one lock instead of a lock and a map lookup per node.
	Live         []LiveBeat
	Now          time.Time
	OfflineAfter time.Duration
	// Held are nodes (by id) that may take no run, with why.
	Held map[string]Reason
}

// LiveBeat is a node's newest heartbeat as a broker holds it beside an
// Index: 16 bytes, no pointer.
type LiveBeat struct {
	At    int64 // unix nanoseconds; 0: none taken
	RTTMS float64
}

// Verdict is one node's verdict, by reference into its Index. It holds no
// pointer: a match writes one per node twice (in node order, then sorted),
// and at 100,000 nodes arrays of verdicts holding times and slices cost
// the collector a scan and every copy a write barrier. The reasons and
// the score's terms are read through the Verdicts (Why, Terms).
type Verdict struct {
	Node       int32 // index into the Index
	OutOfScope bool
	Online     bool
	// why and nWhy are the node's reasons: Verdicts.arena[why:why+nWhy].
	nWhy uint16
	why  int32
	// LastSeen (unix nanoseconds, 0: never) and RTTMS are the node's
	// liveness with the newest beat.
	LastSeen int64
	RTTMS    float64
	// Score is the health score (0 out of scope); Verdicts.Terms gives
	// it term by term.
	Score float64
}

// LastSeenTime is LastSeen as a time (the zero time: never).
func (v *Verdict) LastSeenTime() time.Time {
	if v.LastSeen == 0 {
		return time.Time{}
	}
	return time.Unix(0, v.LastSeen).UTC()
}

// Verdicts are the outcome of a match: candidates by score (then price,
// then id), then excluded nodes (in scope by score then id, out of scope
// last). Each distinct reason is in Reasons once; verdicts refer to it.
type Verdicts struct {
	Candidates []Verdict
	Excluded   []Verdict
	Reasons    []Reason
	ix         *Index
	capMS      float64
	arena      []int32
	buf        *matchBuf
}

// Why returns v's reasons as indexes into Reasons (shared: do not modify).
func (vs *Verdicts) Why(v *Verdict) []int32 {
	return vs.arena[v.why : v.why+int32(v.nWhy) : v.why+int32(v.nWhy)]
}

// Terms returns v's health score term by term (the zero Score out of
// scope), recomputed from the node's inputs as the match computed
// v.Score: the same value, bit for bit.
func (vs *Verdicts) Terms(v *Verdict) health.Score {
	if v.OutOfScope {
		return health.Score{}
	}
	return vs.ix.ent[v.Node].score(v.RTTMS, vs.capMS)
}

// matchBuf holds the per-node buffers of one match. A match over 10,000
// nodes needs about a megabyte of them; taking them from a pool, and
// giving them back with Release once the answer is written, saves
// allocating and collecting that on every call.
type matchBuf struct {
	all, sorted []Verdict
	arena       []int32
	keys, tmp   []sortKey
}

var matchBufs = sync.Pool{New: func() any { return new(matchBuf) }}

// Release gives the verdicts' buffers back for reuse by a later match.
// The Verdicts (their Candidates, Excluded and each one's reasons) must
// not be used after; calling it is optional (without it the buffers are
// garbage collected) and a second call does nothing.
func (vs *Verdicts) Release() {
	if vs.buf == nil {
		return
	}
	matchBufs.Put(vs.buf)
	*vs = Verdicts{}
}

// grow returns s with length n, reusing its array when large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// matcher holds the memos of one match: each distinct key is compared
// with the spec once, each distinct reason built once.
type matcher struct {
	ix  *Index
	q   *Query
	out *Verdicts

	inScope, inFilter []int8 // per region name: 0 unknown, 1 yes, 2 no
	scopeWhy, filter  []int32
	runtimeWhy        [][]int32
	runtimeDone       []bool
	resourceWhy       [][]int32
	resourceDone      []bool
	byValue           map[valueKey]int32
	byReason          map[Reason]int32
	arena             []int32
	// offline memoises the offline reason by the heartbeat's time (most
	// offline nodes of a fleet went quiet together, or never beat).
	offline map[int64]int32
}

type valueKey struct {
	code string
	v    float64
}

func (m *matcher) add(r Reason) int32 {
	if id, ok := m.byReason[r]; ok {
		return id
	}
	id := int32(len(m.out.Reasons))
	m.out.Reasons = append(m.out.Reasons, r)
	m.byReason[r] = id
	return id
}

// byVal memoises a reason that depends on one number (a score, a price)
// as num writes it: rounded to two decimals. Scores differ in every node
// whose latency does; the reasons of those below the threshold are built
// once per rounded value, not once per node.
func (m *matcher) byVal(code string, v float64, mk func() Reason) int32 {
	k := valueKey{code, math.Round(v*100) / 100}
	if id, ok := m.byValue[k]; ok {
		return id
	}
	// Only byVal makes reasons of these codes, one per key: no need to
	// look the reason up in byReason (a map keyed by five strings).
	id := int32(len(m.out.Reasons))
	m.out.Reasons = append(m.out.Reasons, mk())
	m.byValue[k] = id
	return id
}

func (m *matcher) adds(rs []Reason) []int32 {
	ids := make([]int32, len(rs))
	for i, r := range rs {
		ids[i] = m.add(r)
	}
	return ids
}

// offlineWhy is the reason of a node last seen at (unix nanoseconds, 0:
// never).
func (m *matcher) offlineWhy(at int64) int32 {
	if id, ok := m.offline[at]; ok {
		return id
	}
	r := Reason{Code: CodeOffline, Field: "heartbeat", Measured: "never", Message: "never sent a heartbeat"}
	if at != 0 {
		last := time.Unix(0, at)
		r.Measured = last.UTC().Format(time.RFC3339)
		r.Message = fmt.Sprintf("last heartbeat %s ago (offline after %s)", m.q.Now.Sub(last).Round(time.Second), m.q.OfflineAfter)
	}
	id := m.add(r)
	m.offline[at] = id
	return id
}

// Match matches and scores every indexed node for q.
func (ix *Index) Match(q Query) Verdicts {
	buf := matchBufs.Get().(*matchBuf)
	out := Verdicts{ix: ix, buf: buf}
	m := &matcher{ix: ix, q: &q, out: &out,
		inScope: make([]int8, len(ix.names)), inFilter: make([]int8, len(ix.names)),
		scopeWhy: make([]int32, len(ix.names)), filter: make([]int32, len(ix.names)),
		runtimeWhy: make([][]int32, len(ix.runtimes)), runtimeDone: make([]bool, len(ix.runtimes)),
		resourceWhy: make([][]int32, len(ix.res)), resourceDone: make([]bool, len(ix.res)),
		byValue: map[valueKey]int32{}, byReason: map[Reason]int32{}, offline: map[int64]int32{},
		arena: grow(buf.arena, 2*len(ix.nodes))[:0],
	}
	var capMS float64
	if q.Spec != nil {
		capMS = q.Spec.Resources.Network.LatencyToleranceMS
	}
	out.capMS = capMS
	scope, filter := strings.Join(q.Scope, ","), strings.Join(q.Regions, ",")
	maxPrice, minScore := num(q.MaxPrice), num(q.MinScore)
	now, offAfter := q.Now.UnixNano(), int64(q.OfflineAfter)
	all := grow(buf.all, len(ix.nodes))
	buf.all = all
	var why [16]int32
	nIn, nOut := 0, 0
	for i := range ix.ent {
		e, v, l := &ix.ent[i], &all[i], ix.live[i]
		// Every field is set: the buffer may hold an earlier match's.
		*v = Verdict{Node: int32(i), LastSeen: l.at, RTTMS: l.rtt}
		if q.Live != nil {
			if lb := q.Live[i]; lb.At > v.LastSeen {
				v.LastSeen = lb.At
				if lb.RTTMS >= 0 {
					v.RTTMS = lb.RTTMS
				}
			}
		} else if q.Beat != nil {
			if hb, ok := q.Beat(ix.ids[i]); ok {
				if at := unixNano(hb.At); at > v.LastSeen {
					v.LastSeen = at
					if hb.RTTMS >= 0 {
						v.RTTMS = hb.RTTMS
					}
				}
			}
		}
		rs := why[:0]
		reg := e.region
		if m.inScope[reg] == 0 {
			m.inScope[reg] = 2
			if MatchRegion(q.Scope, ix.names[reg]) {
				m.inScope[reg] = 1
			} else {
				region := ix.names[reg]
				m.scopeWhy[reg] = m.add(Reason{Code: CodeRegionScope, Field: "region", Expected: scope, Measured: region,
					Message: fmt.Sprintf("region %s is outside the token's scope %s", region, scope)})
			}
		}
		if m.inScope[reg] == 2 {
			v.OutOfScope = true
			m.keep(v, append(rs, m.scopeWhy[reg]))
			nOut++
			continue
		}
		v.Online = v.LastSeen != 0 && now-v.LastSeen <= offAfter
		v.Score = e.score(v.RTTMS, capMS).Score
		if len(q.Regions) > 0 {
			if m.inFilter[reg] == 0 {
				m.inFilter[reg] = 1
				if region := ix.names[reg]; !MatchRegion(q.Regions, region) {
					m.inFilter[reg] = 2
					m.filter[reg] = m.add(Reason{Code: CodeRegionFilter, Field: "region", Expected: filter, Measured: region,
						Message: fmt.Sprintf("region %s is not among the requested regions %s", region, filter)})
				}
			}
			if m.inFilter[reg] == 2 {
				rs = append(rs, m.filter[reg])
			}
		}
		if len(q.Held) > 0 {
			if r, ok := q.Held[ix.ids[i]]; ok {
				rs = append(rs, m.add(r))
			}
		}
		if !e.hasReport {
			rs = append(rs, m.add(Reason{Code: CodeNoReport, Message: "no verified conformance report yet"}))
		}
		if !v.Online {
			rs = append(rs, m.offlineWhy(v.LastSeen))
		}
		if q.Spec != nil && e.hasReport {
			if !e.passed {
				rs = m.failedWhy(rs, ix.nodes[i].Index.FailedChecks)
			}
			rs = append(rs, m.runtime(e.runtime)...)
			rs = append(rs, m.resource(e.resource)...)
		}
		if p := e.price; q.MaxPrice > 0 && p > q.MaxPrice {
			rs = append(rs, m.byVal(CodePriceAboveMax, p, func() Reason {
				got := num(p)
				return Reason{Code: CodePriceAboveMax, Field: "price_per_hour", Expected: "<= " + maxPrice, Measured: got,
					Message: "price " + got + "/h is above the maximum price " + maxPrice + "/h"}
			}))
		}
		if s := v.Score; q.Spec != nil && s < q.MinScore {
			rs = append(rs, m.byVal(CodeScoreBelow, s, func() Reason {
				got := num(s)
				return Reason{Code: CodeScoreBelow, Field: "health_score", Expected: ">= " + minScore, Measured: got,
					Message: "health score " + got + " is below the minimum health score " + minScore}
			}))
		}
		if len(rs) > 0 {
			m.keep(v, rs)
			nOut++
		} else {
			nIn++
		}
	}
	out.arena = m.arena
	// Sort small keys, then copy each verdict once into its place. The
	// keys are made in node id order and the sort is stable: equal keys
	// stay in id order.
	keys := grow(buf.keys, len(all))
	buf.keys = keys
	cand, excl := keys[:0:nIn], keys[nIn:nIn]
	for _, i := range ix.byID {
		v := &all[i]
		if v.nWhy == 0 {
			cand = append(cand, sortKey{a: ^orderedBits(v.Score), b: orderedBits(ix.ent[i].price), i: i})
			continue
		}
		var out uint64
		if v.OutOfScope {
			out = 1
		}
		excl = append(excl, sortKey{a: out, b: ^orderedBits(v.Score), i: i})
	}
	buf.tmp = grow(buf.tmp, len(all))
	cand = radixSort(cand, buf.tmp[:len(cand)])
	excl = radixSort(excl, buf.tmp[len(cand):])
	sorted := grow(buf.sorted, len(all))
	buf.sorted = sorted
	for j, k := range cand {
		sorted[j] = all[k.i]
	}
	for j, k := range excl {
		sorted[len(cand)+j] = all[k.i]
	}
	out.Candidates, out.Excluded = sorted[:len(cand):len(cand)], sorted[len(cand):]
	return out
}

// keep copies a node's reason ids into the match's arena (one array for
// all nodes instead of one per node) and points v at them.
func (m *matcher) keep(v *Verdict, rs []int32) {
	if len(rs) > math.MaxUint16 {
		rs = rs[:math.MaxUint16] // never: a node has a reason per check, at most a few
	}
	v.why, v.nWhy = int32(len(m.arena)), uint16(len(rs))
	m.arena = append(m.arena, rs...)
	m.out.buf.arena = m.arena
}

// failedWhy adds a reason for each failed check of the node's report
// ("slurm.node: slurm node n1 is drain: fan"): why it is not certified,
// in the node's own words.
func (m *matcher) failedWhy(rs []int32, failed []string) []int32 {
	for _, f := range failed {
		name, _, ok := strings.Cut(f, ": ")
		if !ok {
			name = "" // the "and more" marker
		}
		rs = append(rs, m.add(Reason{Code: CodeConformanceFailed, Field: name, Message: "failed check " + f}))
	}
	return rs
}

func (m *matcher) runtime(k int32) []int32 {
	if !m.runtimeDone[k] {
		rk := m.ix.runtimes[k]
		var rs []Reason
		if !rk.passed {
			rs = append(rs, Reason{Code: CodeConformanceFailed, Message: "the node's last conformance report has failed checks"})
		}
		rs = append(rs, runtimeMismatches(m.q.Spec, store.NodeIndex{Runtime: conformance.Runtime{NvidiaDriver: rk.driver, CUDA: rk.cuda,
			Python: rk.python, PyTorch: rk.pytorch, FIPSEnabled: rk.fips}})...)
		m.runtimeWhy[k], m.runtimeDone[k] = m.adds(rs), true
	}
	return m.runtimeWhy[k]
}

func (m *matcher) resource(k int32) []int32 {
	if !m.resourceDone[k] {
		sk := m.ix.res[k]
		ni := store.NodeIndex{Accelerator: sk.accelerator, GPUCount: sk.count,
			StorageClass: sk.storageClass, StorageFreeGB: sk.freeGB, BandwidthGbps: sk.bwGbs}
		if sk.gres >= 0 {
			ni.GresGPUs = &sk.gres
		}
		m.resourceWhy[k] = m.adds(resourceMismatches(m.q.Spec, ni))
		m.resourceDone[k] = true
	}
	return m.resourceWhy[k]
}

// score is the health score of a node with latency rtt (package doc),
// computed by internal/health as a client recomputes it.
func (e *entry) score(rtt, capMS float64) health.Score {
	return health.Compute(rtt, capMS, e.launches, e.failures, e.price, e.classMean)
}

// sortKey orders verdicts by a, then b; a and b encode the order of each
// list: candidates by score descending then price ascending, excluded by
// in-scope first then score descending. i is the verdict's index.
type sortKey struct {
	a, b uint64
	i    int32
}

// radixSort sorts keys by (a, b), stably, using tmp (as long as keys) for
// the passes, and returns the sorted keys (in keys' or tmp's array). It is
// a least-significant-digit radix sort a byte at a time, skipping the
// bytes that every key shares (the exponent bytes of scores and prices,
// the zero bytes of round prices): ten thousand keys sort in a fraction
// of the time a comparison sort takes.
func radixSort(keys, tmp []sortKey) []sortKey {
	if len(keys) < 2 {
		return keys
	}
	var hist [16][256]int32
	for i := range keys {
		a, b := keys[i].a, keys[i].b
		for d := range 8 {
			hist[d][byte(b>>(8*d))]++
			hist[8+d][byte(a>>(8*d))]++
		}
	}
	src, dst := keys, tmp[:len(keys)]
	n := int32(len(keys))
	for d := range 16 {
		shift := uint(8 * (d % 8))
		digit := func(k *sortKey) byte {
			if d < 8 {
				return byte(k.b >> shift)
			}
			return byte(k.a >> shift)
		}
		h := &hist[d]
		if h[digit(&src[0])] == n {
			continue // every key has this byte
		}
		var off int32
		for c, cnt := range h {
			h[c] = off
			off += cnt
		}
		for i := range src {
			k := &src[i]
			c := digit(k)
			dst[h[c]] = *k
			h[c]++
		}
		src, dst = dst, src
	}
	return src
}

// orderedBits maps a float64 to a uint64 in the same order (NaN aside).
func orderedBits(f float64) uint64 {
	b := math.Float64bits(f)
	if b>>63 == 1 {
		return ^b
	}
	return b | 1<<63
}
