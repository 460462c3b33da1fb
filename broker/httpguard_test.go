package broker_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
)

// TestRefusedBeforeBody: a Submit with a 60 MiB body and no valid token
// (none, unknown, malformed) or the wrong role is refused from its
// headers, while the client is still sending: the broker reads next to
// none of the body (issue #16 finding 4). Over the Connect protocol on
// HTTP/1.1 (the CLI) and gRPC on h2c (agents, grpcurl).
func TestRefusedBeforeBody(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	read := "Bearer " + b.Token(t, store.RoleRead, "*")
	const size = 60 << 20
	for _, tc := range []struct {
		name, auth string
		want       connect.Code
	}{
		{"no token", "", connect.CodeUnauthenticated},
		{"unknown token", "Bearer gpp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", connect.CodeUnauthenticated},
		{"malformed header", "Basic dXNlcjpwYXNz", connect.CodeUnauthenticated},
		{"read token", read, connect.CodePermissionDenied},
	} {
		for _, grpc := range []bool{false, true} {
			name := tc.name + "/connect"
			if grpc {
				name = tc.name + "/grpc"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				body := brokertest.NewSubmitBody(size, grpc)
				code, msg, err := brokertest.PostRaw(ctx, b.URL, gpupassv1connect.RunServiceSubmitProcedure, tc.auth, grpc, body)
				sent := body.Sent()
				if err != nil {
					t.Fatalf("after sending %d of %d bytes: %v", sent, body.Len(), err)
				}
				if code != tc.want {
					t.Errorf("code %v (%s), want %v", code, msg, tc.want)
				}
				// Loopback socket buffers hold a few MiB; the old broker read
				// all 60 before it looked at the token.
				if sent > 16<<20 {
					t.Errorf("the client had sent %d MiB of the body when it was refused; want it refused before the body is read", sent>>20)
				}
			})
		}
	}
}
