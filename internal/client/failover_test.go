package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/client"
)

// replica is one broker of several: it counts the calls it took, and can
// break a call after it arrived (as a broker killed mid-call does).
type replica struct {
	gpupassv1connect.UnimplementedRunServiceHandler
	calls atomic.Int64
	abort atomic.Bool
	url   string
}

func (r *replica) ListRuns(context.Context, *connect.Request[gpupassv1.ListRunsRequest]) (*connect.Response[gpupassv1.ListRunsResponse], error) {
	r.calls.Add(1)
	if r.abort.Load() {
		panic(http.ErrAbortHandler) // resets the stream: the call was sent
	}
	return connect.NewResponse(&gpupassv1.ListRunsResponse{}), nil
}

func startReplica(t *testing.T) *replica {
	t.Helper()
	r := &replica{}
	mux := http.NewServeMux()
	mux.Handle(gpupassv1connect.NewRunServiceHandler(r))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Config.ErrorLog = nil
	srv.Start()
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// deadURL is a loopback address where nothing listens (connection refused,
// as after kill -9 of a broker).
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + l.Addr().String()
	_ = l.Close()
	return u
}

type switches struct {
	mu sync.Mutex
	to []string
}

func (s *switches) note(_, to string, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.to = append(s.to, to)
}

func (s *switches) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.to...)
}

// A call to a replica that refuses connections goes to the next one, and
// the client stays there; a call that broke after it was sent is not sent
// again (the broker may have acted on it), but the next call moves on.
func TestFailover(t *testing.T) {
	t.Parallel()
	for _, grpc := range []bool{false, true} {
		a, b := startReplica(t), startReplica(t)
		dead := deadURL(t)
		var sw switches
		c, err := client.DialRuns(strings.Join([]string{dead, a.url, b.url}, ", "), client.Options{GRPC: grpc, OnFailover: sw.note})
		if err != nil {
			t.Fatal(err)
		}
		list := func() error {
			_, err := c.Run.ListRuns(context.Background(), connect.NewRequest(&gpupassv1.ListRunsRequest{}))
			return err
		}
		for range 2 {
			if err := list(); err != nil {
				t.Fatalf("grpc=%v: ListRuns with the first replica down: %v", grpc, err)
			}
		}
		if a.calls.Load() != 2 || b.calls.Load() != 0 {
			t.Fatalf("grpc=%v: calls a=%d b=%d, want 2 and 0 (the client stays on the replica that answers)", grpc, a.calls.Load(), b.calls.Load())
		}
		a.abort.Store(true)
		if err := list(); err == nil {
			t.Fatalf("grpc=%v: a call broken after it was sent succeeded", grpc)
		}
		if a.calls.Load() != 3 || b.calls.Load() != 0 {
			t.Fatalf("grpc=%v: calls a=%d b=%d after a broken call, want 3 and 0 (not sent twice)", grpc, a.calls.Load(), b.calls.Load())
		}
		if err := list(); err != nil {
			t.Fatalf("grpc=%v: ListRuns after a broke: %v", grpc, err)
		}
		if b.calls.Load() != 1 {
			t.Fatalf("grpc=%v: b took %d calls, want 1 (the call after a broke)", grpc, b.calls.Load())
		}
		if got, want := sw.list(), []string{a.url, b.url}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("grpc=%v: moved to %v, want %v", grpc, got, want)
		}
	}
}

// With every replica down a call fails with the connection error, and
// the next one waits out the back-off only as long as its context lets it.
func TestFailoverAllDown(t *testing.T) {
	t.Parallel()
	c, err := client.DialRuns(deadURL(t)+","+deadURL(t), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := c.Run.ListRuns(context.Background(), connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("ListRuns with every replica down: %v, want unavailable", err)
		}
	}
}

func TestParseURLs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    int
		wantErr string
	}{
		{"http://a:1", 1, ""},
		{"http://a:1, http://b:2,,http://c:3", 3, ""},
		{"http://a:1,https://b:2", 0, "one scheme"},
		{"http://a:1,b:2", 0, `"b:2"`},
		{" , ", 0, "want http://HOST:PORT"},
		{strings.Repeat("http://a:1,", client.MaxBrokerURLs+1), 0, "at most"},
	} {
		got, err := client.ParseURLs(tc.in)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseURLs(%q): %v, want an error with %q", tc.in, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || len(got) != tc.want):
			t.Errorf("ParseURLs(%q): %d URLs, %v; want %d", tc.in, len(got), err, tc.want)
		}
	}
}
