package broker

import (
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// listNodesPage answers a paged ListNodes from the registry snapshot's
// match: the nodes in scope and filters in id order, from after the
// page token's node, page_size of them. Only the page is converted to
// the wire form, so a page of a 10,000-node fleet costs the match (in
// memory, shared with dry-run) and a hundred nodes, not 10,000.
func listNodesPage(tok store.Token, snap *snapshot, vs *match.Verdicts, m *gpupassv1.ListNodesRequest) (*connect.Response[gpupassv1.ListNodesResponse], error) {
	size := int(m.PageSize)
	if size <= 0 {
		size = 100
	}
	size = min(size, maxPageSize)
	filters := []string{regionFilter(m.Regions), m.RuntimeFingerprint, boolFilter(m.IncludeOffline)}
	if m.SpecFingerprint != "" {
		// Only when set: tokens issued before the filter existed stay good.
		filters = append(filters, m.SpecFingerprint)
	}
	bind := pageBinding("nodes", tok, filters...)
	after := ""
	if m.PageToken != "" {
		t, err := decodePageToken(m.PageToken, "nodes", bind)
		if err != nil {
			return nil, err
		}
		// The position must be a registered node the caller may see
		// under these filters (online or not: it may have gone offline
		// since the page was served).
		i, ok := snap.pos[t.ID]
		if !ok {
			return nil, errPageToken(errStalePosition)
		}
		n := &snap.nodes[i]
		region := match.Region(n)
		if !match.MatchRegion(tok.Regions, region) || (len(m.Regions) > 0 && !match.MatchRegion(m.Regions, region)) ||
			(m.RuntimeFingerprint != "" && n.Index.RuntimeFingerprint != m.RuntimeFingerprint) {
			return nil, errPageToken(errStalePosition)
		}
		after = t.ID
	}
	ix := snap.index
	resp := &gpupassv1.ListNodesResponse{}
	// Verdicts come by score; the page wants id order, which the index
	// keeps: mark the nodes shown, then walk the index's id order (no
	// sort of the fleet per call).
	shown := make([]*match.Verdict, ix.Len())
	regions, fps := map[string]bool{}, map[string]bool{}
	for _, list := range [][]match.Verdict{vs.Candidates, vs.Excluded} {
		for j := range list {
			v := &list[j]
			if v.OutOfScope {
				continue
			}
			n := ix.Node(v.Node)
			fp := ""
			if n.HasReport {
				fp = n.Index.RuntimeFingerprint
			}
			regions[match.Region(n)] = true
			if fp != "" {
				fps[fp] = true
			}
			filtered := (m.RuntimeFingerprint != "" && fp != m.RuntimeFingerprint) || (m.SpecFingerprint != "" && !certifiedFor(vs, v))
			for _, id := range vs.Why(v) {
				x := vs.Reasons[id]
				filtered = filtered || x.Code == match.CodeRegionFilter || (x.Code == match.CodeOffline && !m.IncludeOffline)
			}
			if !filtered {
				shown[v.Node] = v
			}
		}
	}
	resp.FacetRegions, resp.FacetRuntimeFingerprints = sortedKeys(regions), sortedKeys(fps)
	byID := ix.ByID()
	start := 0
	if after != "" {
		start, _ = slices.BinarySearchFunc(byID, after, func(i int32, id string) int { return strings.Compare(ix.ID(i), id) })
		if start < len(byID) && ix.ID(byID[start]) == after {
			start++
		}
	}
	var rows []*match.Verdict
	total, more := 0, false
	for k, i := range byID {
		if shown[i] == nil {
			continue
		}
		total++
		if k >= start {
			if len(rows) < size {
				rows = append(rows, shown[i])
			} else {
				more = true
			}
		}
	}
	resp.TotalSize = int32(total)
	for _, v := range rows {
		n := toProto(ix.Node(v.Node), v, vs.Terms(v))
		n.Admission = snap.nodeAdmission(n.Id)
		resp.Nodes = append(resp.Nodes, n)
	}
	if more {
		resp.NextPageToken = encodePageToken(pageToken{Kind: "nodes", Bind: bind, ID: ix.ID(rows[len(rows)-1].Node)})
	}
	return connect.NewResponse(resp), nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
func boolFilter(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
