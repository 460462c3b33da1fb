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
	bind := pageBinding("nodes", tok, regionFilter(m.Regions), m.RuntimeFingerprint, boolFilter(m.IncludeOffline))
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
	var regions, fps []string
	var rows []*match.Verdict
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
			regions = append(regions, match.Region(n))
			if fp != "" {
				fps = append(fps, fp)
			}
			filtered := m.RuntimeFingerprint != "" && fp != m.RuntimeFingerprint
			for _, id := range v.Reasons {
				x := vs.Reasons[id]
				filtered = filtered || x.Code == match.CodeRegionFilter || (x.Code == match.CodeOffline && !m.IncludeOffline)
			}
			if !filtered {
				rows = append(rows, v)
			}
		}
	}
	slices.Sort(regions)
	slices.Sort(fps)
	resp.FacetRegions, resp.FacetRuntimeFingerprints = slices.Compact(regions), slices.Compact(fps)
	resp.TotalSize = int32(len(rows))
	slices.SortFunc(rows, func(a, b *match.Verdict) int { return strings.Compare(ix.ID(a.Node), ix.ID(b.Node)) })
	lo := 0
	if after != "" {
		lo, _ = slices.BinarySearchFunc(rows, after, func(v *match.Verdict, id string) int { return strings.Compare(ix.ID(v.Node), id) })
		if lo < len(rows) && ix.ID(rows[lo].Node) == after {
			lo++
		}
	}
	hi := min(lo+size, len(rows))
	for _, v := range rows[lo:hi] {
		resp.Nodes = append(resp.Nodes, toProto(ix.Node(v.Node), v))
	}
	if hi < len(rows) {
		resp.NextPageToken = encodePageToken(pageToken{Kind: "nodes", Bind: bind, ID: ix.ID(rows[hi-1].Node)})
	}
	return connect.NewResponse(resp), nil
}

func boolFilter(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
