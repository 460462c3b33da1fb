package api

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
)

// Run-related request limits (see runs.proto).
const (
	// MaxSubmitBytes bounds a Submit (the work dir archive travels in it).
	MaxSubmitBytes = 64 << 20
	// MaxRecordsBytes bounds one UploadRecords batch.
	MaxRecordsBytes = 16 << 20
)

// RunClients are the run services, dialed with one token. Unlike Dial's
// clients they have no whole-call HTTP timeout: PollWork long-polls and
// GetLogs follows a run for as long as it runs, so callers bound calls
// with their context.
type RunClients struct {
	Run  gpupassv1connect.RunServiceClient
	Work gpupassv1connect.AgentWorkServiceClient
}

// DialRuns returns run clients for the broker at baseURL (o.Timeout is
// ignored; see RunClients).
func DialRuns(baseURL string, o DialOptions) (*RunClients, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("broker URL %q: want http://HOST:PORT or https://HOST:PORT", baseURL)
	}
	base := strings.TrimRight(baseURL, "/")
	hc := HTTPClient(u.Scheme == "https", o.TLSConfig)
	if o.Agent != nil {
		hc.Transport = o.Agent.Transport(hc.Transport)
	}
	opts := []connect.ClientOption{connect.WithInterceptors(bearerAll(o.Token)),
		connect.WithSendMaxBytes(MaxSubmitBytes)}
	if o.GRPC {
		opts = append(opts, connect.WithGRPC())
	}
	if isLoopback(u.Hostname()) {
		opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	return &RunClients{
		Run:  gpupassv1connect.NewRunServiceClient(hc, base, opts...),
		Work: gpupassv1connect.NewAgentWorkServiceClient(hc, base, opts...),
	}, nil
}

// bearerAll adds the token to unary and streaming calls (GetLogs).
type bearerAll string

func (t bearerAll) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if t != "" {
			req.Header().Set(AuthHeader, "Bearer "+string(t))
		}
		return next(ctx, req)
	}
}

func (t bearerAll) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, s connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, s)
		if t != "" {
			conn.RequestHeader().Set(AuthHeader, "Bearer "+string(t))
		}
		return conn
	}
}

func (t bearerAll) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
