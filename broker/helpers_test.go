package broker_test

import (
	"context"
	"crypto/ecdsa"
	"os"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/conformance"
)

func conformanceSign(key *ecdsa.PrivateKey, b []byte) (string, error) {
	return conformance.Sign(key, b)
}

func gpupassv1connectNodeClient(hc connect.HTTPClient, url, token string, o connect.ClientOption) gpupassv1connect.NodeServiceClient {
	return gpupassv1connect.NewNodeServiceClient(hc, url, o, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(api.AuthHeader, "Bearer "+token)
			return next(ctx, req)
		}
	})))
}

func mustRead(tb testing.TB, path string) []byte {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
