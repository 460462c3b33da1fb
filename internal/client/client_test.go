package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/client"
)

// headerRecorder is a RunService that keeps the headers of each call.
type headerRecorder struct {
	gpupassv1connect.UnimplementedRunServiceHandler
	mu   sync.Mutex
	seen map[string]http.Header
}

func (h *headerRecorder) keep(name string, hdr http.Header) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[name] = hdr.Clone()
}

func (h *headerRecorder) ListRuns(_ context.Context, req *connect.Request[gpupassv1.ListRunsRequest]) (*connect.Response[gpupassv1.ListRunsResponse], error) {
	h.keep("unary", req.Header())
	return connect.NewResponse(&gpupassv1.ListRunsResponse{}), nil
}

func (h *headerRecorder) GetLogs(_ context.Context, req *connect.Request[gpupassv1.GetLogsRequest], _ *connect.ServerStream[gpupassv1.GetLogsResponse]) error {
	h.keep("stream", req.Header())
	return nil
}

// The one interceptor puts the token and the user agent on unary and
// streaming calls, over Connect and gRPC alike.
func TestHeadersOnEveryCall(t *testing.T) {
	t.Parallel()
	for _, grpc := range []bool{false, true} {
		rec := &headerRecorder{seen: map[string]http.Header{}}
		mux := http.NewServeMux()
		mux.Handle(gpupassv1connect.NewRunServiceHandler(rec))
		srv := httptest.NewUnstartedServer(mux)
		srv.EnableHTTP2 = true
		srv.Config.Protocols = new(http.Protocols)
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
		srv.Start()
		t.Cleanup(srv.Close)

		c, err := client.DialRuns(srv.URL, client.Options{Token: "s3cret", GRPC: grpc, UserAgent: "gpupass/test"})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := c.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{})); err != nil {
			t.Fatalf("grpc=%v: ListRuns: %v", grpc, err)
		}
		st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: "a"}))
		if err != nil {
			t.Fatalf("grpc=%v: GetLogs: %v", grpc, err)
		}
		for st.Receive() {
		}
		if err := st.Err(); err != nil {
			t.Fatalf("grpc=%v: GetLogs: %v", grpc, err)
		}
		for _, call := range []string{"unary", "stream"} {
			hdr := rec.seen[call]
			if got := hdr.Get(api.AuthHeader); got != "Bearer s3cret" {
				t.Errorf("grpc=%v, %s call: %s %q, want the bearer token", grpc, call, api.AuthHeader, got)
			}
			if got := hdr.Get("User-Agent"); got != "gpupass/test" {
				t.Errorf("grpc=%v, %s call: User-Agent %q, want gpupass/test", grpc, call, got)
			}
		}
	}
}

// Against a real broker: a streaming call (GetLogs) is authenticated, so a
// missing run is "not found", not "unauthenticated"; without a token the
// same call is refused. CAFile makes a self-signed broker trusted.
func TestRealBroker(t *testing.T) {
	t.Parallel()
	b, certFile := brokertest.StartTLS(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleRead, "*")
	ctx := context.Background()
	logs := func(o client.Options) error {
		c, err := client.DialRuns(b.URL, o)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: "no-such-run"}))
		if err != nil {
			return err
		}
		for st.Receive() {
		}
		return st.Err()
	}
	if err := logs(client.Options{Token: tok, CAFile: certFile}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetLogs with a read token: %v, want not_found", err)
	}
	if err := logs(client.Options{CAFile: certFile}); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("GetLogs without a token: %v, want unauthenticated", err)
	}
	if err := logs(client.Options{Token: tok}); err == nil {
		t.Error("GetLogs from a self-signed broker without its CA succeeded")
	} else if _, ok := api.UntrustedCert(err); !ok {
		t.Errorf("GetLogs without the CA: %v, want an untrusted-certificate error", err)
	}
	c, err := client.Dial(b.URL, client.Options{Token: tok, CAFile: certFile, GRPC: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{})); err != nil {
		t.Errorf("ListNodes over gRPC with CAFile: %v", err)
	}
}

func TestBadURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "127.0.0.1:7070", "ftp://h:1", "http://"} {
		_, err := client.Dial(u, client.Options{})
		var ue *client.URLError
		if !errors.As(err, &ue) || ue.URL != u {
			t.Errorf("Dial(%q): %v, want a URLError", u, err)
		}
	}
}
