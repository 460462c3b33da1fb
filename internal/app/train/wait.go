package train

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/brokerrpc"
	"github.com/gpupass/gpupass/internal/client"
)

// Resume reads the runs named by ids from the broker, as they are now, as
// a Result that Follow and Err take: what `gpupass wait` follows, however
// often it is started again. An id is a run's allocation id or a run
// group id (api.GroupIDPrefix…), which stands for every run of the group
// in the caller's scope; a run named twice is followed once.
func Resume(ctx context.Context, dial func() (*client.RunClients, error), ids []string) (*Result, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("no run to wait for: pass a run group id or allocation ids, as gpupass train prints them")
	}
	for _, id := range ids {
		switch {
		case strings.HasPrefix(id, api.GroupIDPrefix):
			if err := api.CheckGroupID(id); err != nil {
				return nil, err
			}
		case !strings.HasPrefix(id, "alloc-"):
			// Checked before the broker is asked: a value from a
			// pipeline that is neither names no run.
			return nil, fmt.Errorf("%q: neither a run group id (group-…) nor an allocation id (alloc-…), as gpupass train prints them", id)
		}
	}
	c, err := dial()
	if err != nil {
		return nil, err
	}
	res := &Result{c: c}
	seen := map[string]bool{}
	add := func(r *gpupassv1.Run) {
		if !seen[r.Id] {
			seen[r.Id] = true
			res.Runs = append(res.Runs, r)
		}
	}
	groups := map[string]bool{}
	for _, id := range ids {
		if strings.HasPrefix(id, api.GroupIDPrefix) {
			runs, err := brokerrpc.GroupRuns(ctx, c, id)
			if err != nil {
				return nil, err
			}
			for _, r := range runs {
				add(r)
			}
			groups[id] = true
			continue
		}
		resp, err := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			return nil, brokerrpc.Error("reading run "+id, c.URL, err)
		}
		add(resp.Msg.Run)
		groups[resp.Msg.Run.GetGroup()] = true
	}
	// The group of the runs, when they share one, for the step's outputs.
	if len(groups) == 1 {
		for g := range groups {
			res.Group = g
		}
	}
	return res, nil
}
