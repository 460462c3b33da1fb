package broker_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/testutil/promtest"
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
				code, msg, err := brokertest.PostRaw(ctx, b.URL, gpupassv1connect.RunServiceSubmitProcedure, tc.auth, grpc, body, body.Len())
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

// stalled sends head, then nothing until the test ends: a client that
// trickles its body slower than any rate.
type stalled struct {
	head []byte
	stop <-chan struct{}
}

func (s *stalled) Read(p []byte) (int, error) {
	if len(s.head) > 0 {
		n := copy(p, s.head)
		s.head = s.head[n:]
		return n, nil
	}
	<-s.stop
	return 0, io.EOF
}

func guardedBroker(t *testing.T) *brokertest.Broker {
	t.Helper()
	cfg := brokertest.Fast()
	// Parallel subtests may start minutes after their parent placed a
	// run (a busy CI machine): the run must still be waiting then, not
	// timed out and re-placed.
	cfg.StartTimeout = time.Hour
	cfg.OfflineAfter = time.Hour
	return brokertest.StartWithOptions(t, brokertest.NewDB(t, "sqlite"), cfg,
		broker.ServeOptions{Limits: broker.HTTPLimits{BodyGrace: time.Second, BodyMinRate: 4 << 10}})
}

// TestSlowBodyEnded: an authenticated call whose body stops arriving is
// ended with deadline_exceeded once the body grace has passed (issue #16
// finding 5), over HTTP/1.1 with a length and chunked, and over h2c, where
// the deadline is the stream's.
func TestSlowBodyEnded(t *testing.T) {
	t.Parallel()
	b := guardedBroker(t)
	auth := "Bearer " + b.Token(t, store.RoleSubmit, "*")
	for _, tc := range []struct {
		name string
		grpc bool
		size int64
	}{
		{"connect with length", false, 1 << 20},
		{"connect chunked", false, -1},
		{"grpc h2c", true, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stop := make(chan struct{})
			defer close(stop)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			head := []byte{6<<3 | 2, 0x80, 0x80, 0x40} // a 1 MiB work dir, of which 4 bytes come
			if tc.grpc {
				head = append([]byte{0, 0, 0x10, 0, 4}, head...)
			}
			code, msg, err := brokertest.PostRaw(ctx, b.URL, gpupassv1connect.RunServiceSubmitProcedure, auth, tc.grpc, &stalled{head: head, stop: stop}, tc.size)
			if err != nil {
				t.Fatal(err)
			}
			if code != connect.CodeDeadlineExceeded || !strings.Contains(msg, "too slowly") {
				t.Errorf("stalled body: %v %q, want deadline_exceeded saying it arrived too slowly", code, msg)
			}
		})
	}
}

// TestLongCallsOutliveBodyDeadline: the body deadline ends with the body.
// A long poll (PollWork, gRPC as agents send it) and a log follow
// (GetLogs, a Connect server stream as the CLI reads it) run well past
// the body grace.
func TestLongCallsOutliveBodyDeadline(t *testing.T) {
	t.Parallel()
	b := guardedBroker(t)
	agentTok := b.Token(t, store.RoleAgent, "*")
	brokertest.Register(t, b.URL, agentTok, brokertest.H100("us-west-2", 20))
	a := brokertest.NewAgent(t, b.URL, agentTok, brokertest.H100("ap-south-1", 20)) // no report: gets no work
	admin := b.Token(t, store.RoleAdmin, "*")
	c := dialRuns(t, b, admin)
	run := submit(t, c, "us-west-2", nil) // matched, never started: its log stays open and empty
	t.Run("PollWork", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := a.Runs(t, b.URL, agentTok).Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: a.ID, WaitSeconds: 3}))
		if err != nil {
			t.Errorf("a 3 s long poll with a 1 s body grace: %v", err)
		}
	})
	// HTTP/1.1 as well as h2c: there a read deadline left on the
	// connection would end the call once the body is in.
	h1 := &http.Transport{Protocols: new(http.Protocols)}
	h1.Protocols.SetHTTP1(true)
	t.Cleanup(h1.CloseIdleConnections)
	for name, runs := range map[string]gpupassv1connect.RunServiceClient{
		"h2c":      c.Run,
		"HTTP/1.1": gpupassv1connect.NewRunServiceClient(&http.Client{Transport: h1}, b.URL),
	} {
		t.Run("GetLogs follow/"+name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ended := make(chan error, 1)
			var last *gpupassv1.GetLogsResponse
			go func() {
				// The call returns with the first message: an empty follow
				// blocks in it.
				req := connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, Follow: true})
				req.Header().Set(api.AuthHeader, "Bearer "+admin)
				st, err := runs.GetLogs(ctx, req)
				if err != nil {
					ended <- err
					return
				}
				for st.Receive() {
					last = st.Msg()
				}
				ended <- st.Err()
			}()
			select {
			case err := <-ended:
				t.Fatalf("the follow ended by itself within 3 s: %v (last message %v)", err, last)
			case <-time.After(3 * time.Second):
			}
			cancel()
			if err := <-ended; connect.CodeOf(err) != connect.CodeCanceled {
				t.Errorf("follow after cancel: %v, want canceled", err)
			}
		})
	}
}

// TestConnCapRefusalsCounted: a connection over --max-conns-per-ip is
// closed at accept, before any request is read, and counted in
// refusals_total{reason="conns"}, so an operator sees the cap biting in
// metrics and not only in a rate-limited log line.
func TestConnCapRefusalsCounted(t *testing.T) {
	t.Parallel()
	b := brokertest.StartWithOptions(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast(),
		broker.ServeOptions{Limits: broker.HTTPLimits{MaxConnsPerIP: 2}})
	addr := strings.TrimPrefix(b.URL, "http://")
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The broker resets the third connection as it accepts it: on a busy
	// machine the reset can reach the dial itself.
	over, err := net.Dial("tcp", addr)
	switch {
	case errors.Is(err, syscall.ECONNRESET):
	case err != nil:
		t.Fatal(err)
	default:
		_ = over.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := over.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
			t.Fatalf("third connection from one address: read %d bytes, err %v; want it closed by the broker", n, err)
		}
		_ = over.Close()
	}
	for _, c := range held {
		_ = c.Close()
	}
	// The held connections are let go once the broker sees them closed;
	// until then a scrape from this address is itself over the cap.
	tok := b.Token(t, store.RoleRead, "*")
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, b.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			fams := promtest.Parse(t, body)
			if n, ok := promtest.Value(fams, "gpupass_broker_refusals_total", "reason=conns"); !ok || n < 1 {
				t.Fatalf("refusals_total{reason=conns} = %v (present %v), want >= 1", n, ok)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape after closing the held connections: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
