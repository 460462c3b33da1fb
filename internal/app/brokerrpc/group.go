package brokerrpc

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// MaxGroupRuns is the most runs one group id expands to: the broker's cap
// on ListRuns (a group holds one run per region of a submission).
const MaxGroupRuns = 1000

// GroupRuns returns the runs of a run group in the token's scope, oldest
// first: what a group id stands for in wait, compare and audit. A group
// with no run in scope is an error that says what a group id is.
func GroupRuns(ctx context.Context, c *client.RunClients, group string) ([]*gpupassv1.Run, error) {
	if err := api.CheckGroupID(group); err != nil {
		return nil, err
	}
	resp, err := c.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Group: group, Limit: MaxGroupRuns}))
	if err != nil {
		return nil, Error("listing the runs of group "+group, c.URL, err)
	}
	if len(resp.Msg.Runs) == 0 {
		return nil, fmt.Errorf("run group %s: no runs in this token's scope at %s (a group id as gpupass train printed it, and a token of its regions)", group, c.URL)
	}
	return resp.Msg.Runs, nil
}
