package client

import (
	"context"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// Heartbeat sends req, a beat MACed with sessionKey (nil for a signed
// beat), and sends it once more with the key itself when the replica that
// answers holds only the key's verifier and asks for it
// (api.SessionKeyWantedHeader). Every heartbeat sender uses it.
func (c *Clients) Heartbeat(ctx context.Context, req *gpupassv1.HeartbeatRequest, sessionKey []byte) (*gpupassv1.HeartbeatResponse, error) {
	resp, err := c.Agent.Heartbeat(ctx, connect.NewRequest(req))
	if err != nil && sessionKey != nil && api.SessionKeyWanted(err) {
		// The broker refused before taking the counter: the same beat,
		// MAC and all, goes again.
		r := connect.NewRequest(req)
		r.Header().Set(api.SessionKeyHeader, api.EncodeSessionKey(sessionKey))
		resp, err = c.Agent.Heartbeat(ctx, r)
	}
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}
