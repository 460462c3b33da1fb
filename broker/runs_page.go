package broker

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// listRunsPage reads one page of ListRuns: limit runs newest first, after
// the page token's run when there is one (a keyset on created_at, id),
// and a token for the next page when older runs follow.
func (b *Broker) listRunsPage(ctx context.Context, rs store.Runs, tok store.Token, m *gpupassv1.ListRunsRequest, limit int, inScope func(string) bool) (*connect.Response[gpupassv1.ListRunsResponse], error) {
	bind := pageBinding("runs", tok, regionFilter(m.Regions))
	var after store.AllocKey
	if m.PageToken != "" {
		t, err := decodePageToken(m.PageToken, "runs", bind)
		if err != nil {
			return nil, err
		}
		// The position must be a run the caller may see under these
		// regions, at its stored time: one lookup by primary key.
		a, err := rs.Alloc(ctx, t.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, errPageToken(errStalePosition)
		}
		if err != nil {
			return nil, b.storeErr("listing runs", err)
		}
		if !match.MatchRegion(tok.Regions, a.Region) || (len(m.Regions) > 0 && !match.MatchRegion(m.Regions, a.Region)) ||
			a.CreatedAt.UnixNano() != t.At {
			return nil, errPageToken(errStalePosition)
		}
		after = store.AllocKey{CreatedAt: a.CreatedAt, ID: a.ID}
	}
	// One row past the page says whether another follows.
	all, err := rs.ListAllocsAfter(ctx, after, limit+1, inScope)
	if err != nil {
		return nil, b.storeErr("listing runs", err)
	}
	resp := &gpupassv1.ListRunsResponse{}
	if len(all) > limit {
		all = all[:limit]
		last := all[limit-1]
		resp.NextPageToken = encodePageToken(pageToken{Kind: "runs", Bind: bind, ID: last.ID, At: last.CreatedAt.UnixNano()})
	}
	resp.Runs = b.runsProto(ctx, rs, all)
	return connect.NewResponse(resp), nil
}

// listGroup is ListRuns of one group: its runs the caller may see, oldest
// first, in one page (a group holds at most maxGroupRuns).
func (b *Broker) listGroup(ctx context.Context, rs store.Runs, group string, limit int, inScope func(string) bool) (*connect.Response[gpupassv1.ListRunsResponse], error) {
	if err := api.CheckGroupID(group); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	all, err := rs.GroupAllocs(ctx, group, min(limit, maxGroupRuns))
	if err != nil {
		return nil, b.storeErr("listing group "+group, err)
	}
	resp := &gpupassv1.ListRunsResponse{}
	seen := all[:0]
	for _, a := range all {
		if inScope(a.Region) {
			seen = append(seen, a)
		}
	}
	resp.Runs = b.runsProto(ctx, rs, seen)
	return connect.NewResponse(resp), nil
}
