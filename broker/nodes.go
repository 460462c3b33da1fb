package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/health"
	"github.com/gpupass/gpupass/internal/spec"
)

type nodeService struct{ b *Broker }

// checkFilter refuses region filters that reach outside the token scope,
// naming the first one: asking for a region you may not see is an error,
// not an empty answer.
func checkFilter(tok store.Token, regions []string) error {
	for _, r := range regions {
		r = strings.TrimSpace(r)
		if _, err := path.Match(r, ""); err != nil || r == "" {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("region filter %q is not a valid pattern", r))
		}
		// A pattern is in scope when a scope pattern matches it as a
		// literal ("eu-*" within "eu-*" or "*").
		if err := checkRegion(tok, r); err != nil {
			return err
		}
	}
	return nil
}

func (s *nodeService) ListNodes(ctx context.Context, req *connect.Request[gpupassv1.ListNodesRequest]) (*connect.Response[gpupassv1.ListNodesResponse], error) {
	b := s.b
	tok, _ := TokenFrom(ctx)
	if err := checkFilter(tok, req.Msg.Regions); err != nil {
		return nil, err
	}
	snap, err := b.snapshot(ctx)
	if err != nil {
		b.log.Error("reading registry", "err", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("registry unavailable"))
	}
	q := match.Query{Scope: tok.Regions, Regions: req.Msg.Regions, Now: time.Now(), OfflineAfter: b.cfg.OfflineAfter}
	if fp := req.Msg.SpecFingerprint; fp != "" {
		// Matched against the spec, for its runtime verdicts only:
		// listNodesPage keeps the nodes certified for it, whatever their
		// score.
		if q.Spec, err = b.specByFingerprint(ctx, tok, fp); err != nil {
			return nil, err
		}
		q.MinScore = -math.MaxFloat64
	}
	vs := b.match(snap, q)
	if req.Msg.PageSize > 0 || req.Msg.PageToken != "" || req.Msg.RuntimeFingerprint != "" || req.Msg.SpecFingerprint != "" {
		defer vs.Release()
		return listNodesPage(tok, snap, &vs, req.Msg)
	}
	resp := &gpupassv1.ListNodesResponse{}
	for _, v := range append(vs.Candidates, vs.Excluded...) {
		if v.OutOfScope {
			continue
		}
		filtered := false
		for _, id := range vs.Why(&v) {
			x := vs.Reasons[id]
			filtered = filtered || x.Code == match.CodeRegionFilter || (x.Code == match.CodeOffline && !req.Msg.IncludeOffline)
		}
		if !filtered {
			n := toProto(snap.index.Node(v.Node), &v, vs.Terms(&v))
			n.Admission = snap.nodeAdmission(n.Id)
			resp.Nodes = append(resp.Nodes, n)
		}
	}
	vs.Release()
	return connect.NewResponse(resp), nil
}

// parseSpec reads the spec of a dry-run: YAML is validated by the same
// rules as `gpupass validate`; JSON must be a spec.Spec.
func parseSpec(m *gpupassv1.DryRunRequest) (*spec.Spec, string, error) {
	switch {
	case len(m.GetSpecYaml()) > 0:
		res := spec.Validate("spec_yaml", m.GetSpecYaml())
		if !res.Valid {
			return nil, "", invalidSpecYAML(res)
		}
		return res.Spec, res.Fingerprint, nil
	case len(m.GetSpecJson()) > 0:
		sp, err := spec.Decode(m.GetSpecJson())
		if err != nil {
			return nil, "", fmt.Errorf("spec_json: %v", err)
		}
		fp, err := spec.Fingerprint(sp)
		if err != nil {
			return nil, "", fmt.Errorf("spec_json: %v", err)
		}
		if fe := specRules(m.GetSpecJson(), fp); fe != nil {
			return nil, "", fe
		}
		return sp, fp, nil
	}
	return nil, "", errors.New("no spec: set spec_yaml or spec_json")
}

// specRules holds a spec sent as JSON alone (no file as written) to the
// rules gpupass validate applies to a file: JSON is YAML, and read as a
// spec file it must be valid and the spec fp fingerprints. Without this
// a client sending spec_json only could run and certify a spec that
// `gpupass validate` refuses (an unpinned CUDA, a missing runtime).
func specRules(js []byte, fp string) *fielderr.Error {
	res := spec.Validate(api.FieldSubmitSpecJSON, js)
	if !res.Valid {
		return fielderr.New(api.FieldSubmitSpecJSON, "", "is not a valid spec (%d errors): %s: run gpupass validate on the spec file it encodes",
			res.Errors, strings.Join(specErrors(res), "; "))
	}
	if res.Fingerprint != fp {
		return fielderr.New(api.FieldSubmitSpecJSON, "", "does not read back as the spec it encodes (fingerprint %s, read as a spec file %s): send spec.Encode of a valid spec, as gpupass train does", fp, res.Fingerprint)
	}
	return nil
}

// invalidSpecYAML is the refusal of a spec_yaml that is not a valid
// spec: its first errors, as gpupass validate names them.
func invalidSpecYAML(res *spec.Result) error {
	return fmt.Errorf("spec_yaml is not a valid spec (%d errors): %s", res.Errors, strings.Join(specErrors(res), "; "))
}

// specErrors are the first errors of res, as gpupass validate names them.
func specErrors(res *spec.Result) []string {
	var msgs []string
	for _, f := range res.Findings {
		if f.Severity == spec.SevError && len(msgs) < 5 {
			msgs = append(msgs, fmt.Sprintf("%d:%d %s: %s", f.Line, f.Column, f.Rule, f.Message))
		}
	}
	return msgs
}

// checkLimits refuses a threshold or budget that is not a finite number
// in range, for DryRun and Submit alike. NaN slips past plain < and >
// checks, and a run's limits are stored as JSON, which has no NaN or Inf.
func checkLimits(minScore, maxPrice float64) error {
	if !(minScore >= -1e6 && minScore <= 100) {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("min_health_score is %v: want a number from -1e6 to 100", minScore))
	}
	if !(maxPrice >= 0) || math.IsInf(maxPrice, 1) {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("max_price is %v: want a finite number, 0 or more (0 = no limit)", maxPrice))
	}
	return nil
}

func (s *nodeService) DryRun(ctx context.Context, req *connect.Request[gpupassv1.DryRunRequest]) (*connect.Response[gpupassv1.DryRunResponse], error) {
	b := s.b
	tok, _ := TokenFrom(ctx)
	m := req.Msg
	if err := checkFilter(tok, m.Regions); err != nil {
		return nil, err
	}
	sp, fp, err := parseSpec(m)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	// A dry run's spec can be asked about next: which nodes are
	// certified for it (ListNodes' spec_fingerprint).
	b.specs.put(fp, sp)
	minScore := match.DefaultMinScore
	if m.MinHealthScore != nil {
		minScore = m.GetMinHealthScore()
	}
	if err := checkLimits(minScore, m.MaxPrice); err != nil {
		return nil, err
	}
	view := m.View
	if view == gpupassv1.DryRunView_DRY_RUN_VIEW_UNSPECIFIED {
		view = gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE
	}
	if _, known := gpupassv1.DryRunView_name[int32(view)]; !known {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("view %d is not one of INLINE, COLUMNS, SUMMARY, INLINE_EXPANDED", view))
	}
	if m.Limit < 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("limit is %d: want 0 (the default, %d) or more, or set all for every node", m.Limit, api.DefaultDryRunLimit))
	}
	snap, err := b.snapshot(ctx)
	if err != nil {
		b.log.Error("reading registry", "err", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("registry unavailable"))
	}
	ix := snap.index
	q := match.Query{Spec: sp, Scope: tok.Regions,
		Regions: m.Regions, MinScore: minScore, MaxPrice: m.MaxPrice, Now: time.Now(), OfflineAfter: b.cfg.OfflineAfter}
	// A spec asking for several nodes: each node of a gang holds its
	// share, and the nodes listed are those matched for it, not for the
	// whole count.
	lq := q
	lq.Spec = match.ListedSpec(sp)
	vs := b.match(snap, lq)
	gangs := b.gangs(snap, q, &vs)
	resp := &gpupassv1.DryRunResponse{SpecFingerprint: fp, MinHealthScore: minScore, ExcludedTotal: int32(len(vs.Excluded)),
		CandidatesTotal: int32(len(vs.Candidates)), ReasonCounts: reasonCounts(ix, vs)}
	for _, g := range gangs.Found {
		pg := &gpupassv1.Gang{Region: g.Region, Accelerator: g.Accelerator, GpusPerNode: int32(g.GPUsPerNode), NodeIds: make([]string, len(g.Nodes))}
		for i, n := range g.Nodes {
			pg.NodeIds[i] = ix.ID(n)
		}
		resp.Gangs = append(resp.Gangs, pg)
	}
	for _, g := range gangs.Missed {
		resp.GangMisses = append(resp.GangMisses, &gpupassv1.GangMiss{Region: g.Region, Reason: g.Reason})
	}
	// The best candidates and the nearest misses, unless every node is
	// asked for: the counts above cover the rest. Listing a fleet of
	// 100,000 nodes was most of a call's CPU, on both sides.
	cands, excl := vs.Candidates, vs.Excluded
	if !m.All {
		limit := int(m.Limit)
		if limit == 0 {
			limit = api.DefaultDryRunLimit
		}
		cands, excl = cands[:min(limit, len(cands))], excl[:min(limit, len(excl))]
	}
	if view == gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS {
		var renum []int32
		resp.Reasons, renum = reasonTable(&vs, excl)
		derive := m.DeriveScoreTerms
		resp.CandidateColumns, resp.ExcludedColumns = columns(ctx, ix, &vs, cands, derive), columns(ctx, ix, &vs, excl, derive)
		if renum != nil {
			for j, id := range resp.ExcludedColumns.ReasonRefs {
				resp.ExcludedColumns.ReasonRefs[j] = uint32(renum[id])
			}
		}
		if derive {
			capMS := sp.Resources.Network.LatencyToleranceMS
			resp.CandidateColumns.DerivedLatencyCapMs, resp.ExcludedColumns.DerivedLatencyCapMs = capMS, capMS
		}
		vs.Release()
		return connect.NewResponse(resp), nil
	}
	// Candidates in short form unless asked for in full (full_nodes,
	// INLINE_EXPANDED's old layout): the full form is four messages and
	// about twenty strings a node for each side to encode and decode.
	resp.Candidates = make([]*gpupassv1.Candidate, len(cands))
	full := m.FullNodes || view == gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED
	cms, slab := make([]gpupassv1.Candidate, len(cands)), newProtoSlab(len(cands), full)
	for i := range cands {
		v := &cands[i]
		if full {
			cms[i].Node = slab.full(i, ix.Node(v.Node), v, vs.Terms(v))
		} else {
			cms[i].Node = slab.lean(i, ix, v, vs.Terms(v))
		}
		resp.Candidates[i] = &cms[i]
	}
	if view == gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE || view == gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED {
		// Each distinct reason becomes one message. INLINE sends it once
		// in the table and each node refers to it by index: writing it out
		// per node was a third of a 10,000-node answer and most of the
		// messages a client had to decode. INLINE_EXPANDED shares the
		// message between nodes (marshalling writes it out for each).
		reasons, renum := reasonTable(&vs, excl)
		ref := func(id int32) int32 {
			if renum == nil {
				return id
			}
			return renum[id]
		}
		expanded := view == gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED
		if !expanded {
			resp.Reasons = reasons
		}
		// One array each for the messages and the references instead of
		// an allocation per node.
		xs := make([]gpupassv1.Excluded, len(excl))
		var refs []uint32
		if !expanded {
			total := 0
			for i := range excl {
				total += len(vs.Why(&excl[i]))
			}
			refs = make([]uint32, 0, total)
		}
		resp.Excluded = make([]*gpupassv1.Excluded, len(excl))
		lean := newProtoSlab(len(excl), false)
		for i := range excl {
			v := &excl[i]
			x := &xs[i]
			x.Node = lean.lean(i, ix, v, vs.Terms(v))
			why := vs.Why(v)
			if expanded {
				x.Reasons = make([]*gpupassv1.Reason, len(why))
				for j, id := range why {
					x.Reasons[j] = reasons[ref(id)]
				}
			} else {
				start := len(refs)
				for _, id := range why {
					refs = append(refs, uint32(ref(id)))
				}
				x.ReasonRefs = refs[start:len(refs):len(refs)]
			}
			resp.Excluded[i] = x
		}
	}
	vs.Release()
	return connect.NewResponse(resp), nil
}

// colBuf is the backing store of one NodeColumns: an array per element
// type, cut into columns. At 10,000 nodes the columns are about two
// megabytes; they are taken from a pool and given back once the answer is
// written (afterWrite), instead of allocated and collected every call.
type colBuf struct {
	str  []string
	u32  []uint32
	refs []uint32
	i32  []int32
	i64  []int64
	f64  []float64
	bool []bool
}

var colBufs = sync.Pool{New: func() any { return new(colBuf) }}

// cut returns the first n entries of *arr as a column and keeps the rest
// in *arr.
func cut[T any](arr *[]T, n int) []T {
	c := (*arr)[:n:n]
	*arr = (*arr)[n:]
	return c
}

// sized returns s with length n, cleared, reusing its array when large
// enough.
func sized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// columns lays verdicts out by column (DRY_RUN_VIEW_COLUMNS), each node
// in the short form of protoSlab.lean, without the score terms that the client
// recomputes when derive is set (NodeColumns.score_terms_derived). Its
// buffers go back to the pool after the answer is written when ctx
// carries afterWrite's list.
func columns(ctx context.Context, ix *match.Index, all *match.Verdicts, vs []match.Verdict, derive bool) *gpupassv1.NodeColumns {
	n := len(vs)
	buf := colBufs.Get().(*colBuf)
	buf.str, buf.u32, buf.i32 = sized(buf.str, n), sized(buf.u32, 4*n), sized(buf.i32, n)
	buf.i64, buf.f64, buf.bool = sized(buf.i64, 3*n), sized(buf.f64, 12*n), sized(buf.bool, 4*n)
	str, u32, i32, i64, f64, bools := buf.str, buf.u32, buf.i32, buf.i64, buf.f64, buf.bool
	c := &gpupassv1.NodeColumns{
		Id: cut(&str, n), Provider: cut(&u32, n), Region: cut(&u32, n), Accelerator: cut(&u32, n),
		GpuCount: cut(&i32, n), PricePerHour: cut(&f64, n), Online: cut(&bools, n), LastSeenUnixNano: cut(&i64, n),
		RttMs: cut(&f64, n), Simulated: cut(&bools, n), ConformancePassed: cut(&bools, n), OutOfScope: cut(&bools, n),
		Score: cut(&f64, n), LatencyMs: cut(&f64, n), LatencyUsedMs: cut(&f64, n), LatencyCapMs: cut(&f64, n),
		LatencyPenalty: cut(&f64, n), FailureRatePct: cut(&f64, n), Launches_24H: cut(&i64, n),
		LaunchFailures_24H: cut(&i64, n), FailurePenalty: cut(&f64, n), ClassMeanPrice: cut(&f64, n),
		PricePremiumPct: cut(&f64, n), PricePenalty: cut(&f64, n), ReasonCount: cut(&u32, n),
	}
	refs := buf.refs[:0]
	// The index's own name table: no per-node lookups.
	c.Strings = ix.Names()
	for i := range vs {
		v := &vs[i]
		provider, region, accel := ix.NameIDs(v.Node)
		c.Id[i], c.Region[i] = ix.ID(v.Node), region
		why := all.Why(v)
		c.ReasonCount[i] = uint32(len(why))
		for _, id := range why {
			refs = append(refs, uint32(id))
		}
		if v.OutOfScope {
			c.OutOfScope[i] = true // say where, not what
			continue
		}
		gpus, simulated, passed := ix.Short(v.Node)
		c.Provider[i], c.Accelerator[i], c.GpuCount[i], c.Simulated[i] = provider, accel, gpus, simulated
		c.PricePerHour[i], c.Online[i], c.RttMs[i] = ix.Price(v.Node), v.Online, v.RTTMS
		c.ConformancePassed[i] = passed
		c.LastSeenUnixNano[i] = v.LastSeen
		terms := all.Terms(v)
		s := &terms
		c.Launches_24H[i], c.LaunchFailures_24H[i], c.ClassMeanPrice[i] = s.Launches24h, s.LaunchFailures24h, s.ClassMeanPrice
		if derive {
			continue
		}
		c.Score[i], c.LatencyMs[i], c.LatencyUsedMs[i], c.LatencyCapMs[i], c.LatencyPenalty[i] = s.Score, s.LatencyMS, s.LatencyUsedMS, s.LatencyCapMS, s.LatencyPenalty
		c.FailureRatePct[i], c.FailurePenalty[i] = s.FailureRatePct, s.FailurePenalty
		c.PricePremiumPct[i], c.PricePenalty[i] = s.PricePremiumPct, s.PricePenalty
	}
	if derive {
		c.ScoreTermsDerived = true
		c.Score, c.LatencyMs, c.LatencyUsedMs, c.LatencyCapMs, c.LatencyPenalty = nil, nil, nil, nil, nil
		c.FailureRatePct, c.FailurePenalty, c.PricePremiumPct, c.PricePenalty = nil, nil, nil, nil
	}
	c.ReasonRefs, buf.refs = refs, refs
	if !afterWrite(ctx, func() { colBufs.Put(buf) }) {
		// Not given back: the answer keeps the arrays; drop them from
		// the buffer (the empty buffer is still worth pooling).
		*buf = colBuf{}
		colBufs.Put(buf)
	}
	// All-zero columns travel empty: 8 bytes a node each, for nothing.
	c.Provider, c.Accelerator, c.ReasonCount = zeroEmpty(c.Provider), zeroEmpty(c.Accelerator), zeroEmpty(c.ReasonCount)
	c.GpuCount, c.PricePerHour, c.Online, c.LastSeenUnixNano = zeroEmpty(c.GpuCount), zeroEmpty(c.PricePerHour), zeroEmpty(c.Online), zeroEmpty(c.LastSeenUnixNano)
	c.RttMs, c.Simulated, c.ConformancePassed, c.OutOfScope = zeroEmpty(c.RttMs), zeroEmpty(c.Simulated), zeroEmpty(c.ConformancePassed), zeroEmpty(c.OutOfScope)
	c.Score, c.LatencyMs, c.LatencyUsedMs, c.LatencyCapMs = zeroEmpty(c.Score), zeroEmpty(c.LatencyMs), zeroEmpty(c.LatencyUsedMs), zeroEmpty(c.LatencyCapMs)
	c.LatencyPenalty, c.FailureRatePct, c.Launches_24H = zeroEmpty(c.LatencyPenalty), zeroEmpty(c.FailureRatePct), zeroEmpty(c.Launches_24H)
	c.LaunchFailures_24H, c.FailurePenalty, c.ClassMeanPrice = zeroEmpty(c.LaunchFailures_24H), zeroEmpty(c.FailurePenalty), zeroEmpty(c.ClassMeanPrice)
	c.PricePremiumPct, c.PricePenalty = zeroEmpty(c.PricePremiumPct), zeroEmpty(c.PricePenalty)
	return c
}

// zeroEmpty returns nil for a column whose every entry is the zero value.
func zeroEmpty[T comparable](col []T) []T {
	var zero T
	for _, v := range col {
		if v != zero {
			return col
		}
	}
	return nil
}

// reasonCounts counts excluded nodes per reason code and field, most
// first (then by code and field).
func reasonCounts(ix *match.Index, vs match.Verdicts) []*gpupassv1.ReasonCount {
	// Reasons differ by expected and measured values; they are counted
	// by code and field. slot maps a reason to its count.
	type key struct{ code, field string }
	slots := map[key]int{}
	slot := make([]int, len(vs.Reasons))
	var out []*gpupassv1.ReasonCount
	for id, r := range vs.Reasons {
		k := key{r.Code, r.Field}
		i, ok := slots[k]
		if !ok {
			i = len(out)
			slots[k] = i
			out = append(out, &gpupassv1.ReasonCount{Code: r.Code, Field: r.Field})
		}
		slot[id] = i
	}
	for i := range vs.Excluded {
		v := &vs.Excluded[i]
		for _, id := range vs.Why(v) {
			c := out[slot[id]]
			c.Nodes++
			// A few nodes to look at, when the list is cut (a node with
			// two reasons of one code and field is named once).
			if n := len(c.ExampleNodeIds); n < maxReasonExamples && (n == 0 || c.ExampleNodeIds[n-1] != ix.ID(v.Node)) {
				c.ExampleNodeIds = append(c.ExampleNodeIds, ix.ID(v.Node))
			}
		}
	}
	out = slices.DeleteFunc(out, func(c *gpupassv1.ReasonCount) bool { return c.Nodes == 0 })
	slices.SortFunc(out, func(a, b *gpupassv1.ReasonCount) int {
		if a.Nodes != b.Nodes {
			return int(b.Nodes - a.Nodes)
		}
		if c := strings.Compare(a.Code, b.Code); c != 0 {
			return c
		}
		return strings.Compare(a.Field, b.Field)
	})
	return out
}

// reasonTable returns the reasons of the listed excluded nodes, each
// once, and renum, each reason's index in that table by its index in
// vs.Reasons. When every excluded node is listed the table is vs.Reasons
// and renum is nil. A cut list sends only what its nodes refer to: at
// 100,000 nodes a match has hundreds of distinct reasons (each measured
// value is one), most of them of nodes not listed.
func reasonTable(vs *match.Verdicts, excl []match.Verdict) ([]*gpupassv1.Reason, []int32) {
	if len(excl) == len(vs.Excluded) {
		table := make([]*gpupassv1.Reason, len(vs.Reasons))
		for i, why := range vs.Reasons {
			table[i] = reasonProto(why)
		}
		return table, nil
	}
	renum := make([]int32, len(vs.Reasons))
	for i := range renum {
		renum[i] = -1
	}
	var table []*gpupassv1.Reason
	for i := range excl {
		for _, id := range vs.Why(&excl[i]) {
			if renum[id] < 0 {
				renum[id] = int32(len(table))
				table = append(table, reasonProto(vs.Reasons[id]))
			}
		}
	}
	return table, renum
}

// maxReasonExamples is how many example node ids each reason count names.
const maxReasonExamples = 3

func reasonProto(r match.Reason) *gpupassv1.Reason {
	return &gpupassv1.Reason{Code: r.Code, Field: r.Field, Expected: r.Expected, Measured: r.Measured, Message: r.Message}
}

// protoSlab holds the messages of an answer's nodes in one array per
// type, not an allocation per message: at 100,000 nodes that was 300,000
// small objects a call for the collector to find and free.
type protoSlab struct {
	nodes    []gpupassv1.Node
	health   []gpupassv1.HealthScore
	runtimes []gpupassv1.Runtime
}

// newProtoSlab makes room for n nodes, each with a score and, when full,
// a runtime.
func newProtoSlab(n int, full bool) *protoSlab {
	s := &protoSlab{nodes: make([]gpupassv1.Node, n), health: make([]gpupassv1.HealthScore, n)}
	if full {
		s.runtimes = make([]gpupassv1.Runtime, n)
	}
	return s
}

// lean is the short form of a node (identity, offer, liveness, score),
// into the slab's i-th messages, from the index alone (see Index.Short).
func (s *protoSlab) lean(i int, ix *match.Index, v *match.Verdict, terms health.Score) *gpupassv1.Node {
	p := &s.nodes[i]
	names := ix.Names()
	provider, region, accel := ix.NameIDs(v.Node)
	p.Id, p.Region = ix.ID(v.Node), names[region]
	if v.OutOfScope {
		return p // out of scope: say where, not what
	}
	gpus, simulated, passed := ix.Short(v.Node)
	p.Provider, p.Accelerator, p.GpuCount, p.Simulated = names[provider], names[accel], gpus, simulated
	p.PricePerHour, p.Online, p.RttMs, p.ConformancePassed = ix.Price(v.Node), v.Online, v.RTTMS, passed
	p.Health = terms.Fill(&s.health[i])
	p.LastSeenUnixNano = v.LastSeen
	return p
}

// toProto is the full form of a node with its verdict's liveness and score.
func toProto(n *store.Node, v *match.Verdict, terms health.Score) *gpupassv1.Node {
	return newProtoSlab(1, true).full(0, n, v, terms)
}

// full is toProto into the slab's i-th messages.
func (s *protoSlab) full(i int, n *store.Node, v *match.Verdict, terms health.Score) *gpupassv1.Node {
	ix := &n.Index
	p := &s.nodes[i]
	p.Id, p.Provider, p.Region, p.Zone, p.Hostname = n.ID, n.Labels.Provider, match.Region(n), n.Labels.Zone, n.Labels.Hostname
	p.StorageClass, p.BandwidthGbps, p.PricePerHour = n.Labels.StorageClass, n.Labels.BandwidthGbps, match.Price(n)
	p.Online, p.RttMs, p.ConformancePassed, p.Health = v.Online, v.RTTMS, ix.Passed, terms.Fill(&s.health[i])
	p.LastSeenUnixNano = v.LastSeen
	if n.HasReport {
		p.Provider, p.Zone, p.Hostname = ix.Provider, ix.Zone, ix.Hostname
		p.Accelerator, p.GpuName, p.GpuCount, p.GpuMemoryMib = ix.Accelerator, ix.GPUName, int32(ix.GPUCount), ix.GPUMemoryMiB
		p.StorageClass, p.StorageFreeGb, p.StorageReadMbps, p.BandwidthGbps = ix.StorageClass, ix.StorageFreeGB, ix.StorageReadMBps, ix.BandwidthGbps
		p.RuntimeFingerprint, p.Simulated, p.Profile = ix.RuntimeFingerprint, ix.Simulated, ix.Profile
		p.FailedChecks = ix.FailedChecks
		p.Runtime = ix.Runtime.Fill(&s.runtimes[i])
		if !ix.GeneratedAt.IsZero() {
			p.ReportGeneratedUnixNano = ix.GeneratedAt.UnixNano()
		}
	}
	return p
}
