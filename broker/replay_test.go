package broker_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
)

// syncBuffer is a log sink tests read while the broker writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReplays: captured signed heartbeats and reports sent again are
// refused and logged, on both stores; so are unsigned and forged beats.
// A report replay is refused by a second broker on the same store too
// (the check reads the last accepted report from the store).
func TestReplays(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			cfg := brokertest.Fast()
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			db := brokertest.NewDB(t, kind)
			b := brokertest.Start(t, db, cfg)
			tok := b.Token(t, store.RoleAgent, "*")
			a := brokertest.Register(t, b.URL, tok, brokertest.H100("us-west-2", 20))
			other := brokertest.NewAgent(t, b.URL, tok, brokertest.H100("us-west-2", 20))
			ctx := context.Background()
			beat := func(req *gpupassv1.HeartbeatRequest) (*gpupassv1.HeartbeatResponse, error) {
				resp, err := a.Clients.Agent.Heartbeat(ctx, connect.NewRequest(req))
				if err != nil {
					return nil, err
				}
				return resp.Msg, nil
			}

			// Heartbeats.
			req, err := a.BeatRequest()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := beat(req); err != nil {
				t.Fatalf("fresh signed beat: %v", err)
			}
			_, err = beat(req)
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "not above") {
				t.Errorf("replayed beat: %v, want failed_precondition (counter not above the last)", err)
			}
			forged := &gpupassv1.HeartbeatRequest{AgentId: a.ID, Counter: req.Counter + 10, EchoBrokerTimeUnixNano: req.EchoBrokerTimeUnixNano}
			forged.Signature, _ = conformance.Sign(other.Key, api.HeartbeatPayload(forged))
			if _, err := beat(forged); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "signature does not verify") {
				t.Errorf("beat signed by another agent's key: %v, want permission_denied", err)
			}
			altered := &gpupassv1.HeartbeatRequest{AgentId: a.ID, Counter: req.Counter + 20, EchoBrokerTimeUnixNano: req.EchoBrokerTimeUnixNano, Signature: req.Signature}
			if _, err := beat(altered); connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("beat with a raised counter under the old signature: %v, want permission_denied", err)
			}
			if _, err := beat(&gpupassv1.HeartbeatRequest{AgentId: a.ID, Counter: req.Counter + 30}); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "not signed") {
				t.Errorf("unsigned beat: %v, want invalid_argument", err)
			}
			// A beat held back past the echo window is not counted.
			old := &gpupassv1.HeartbeatRequest{AgentId: a.ID, Counter: req.Counter + 40, EchoBrokerTimeUnixNano: time.Now().Add(-2 * cfg.OfflineAfter).UnixNano()}
			old.Signature, _ = conformance.Sign(a.Key, api.HeartbeatPayload(old))
			if hb, err := beat(old); err != nil || !hb.StaleEcho {
				t.Errorf("beat echoing a broker time older than the window: %v, %v; want it answered stale_echo", hb, err)
			}
			if hb, err := a.Beat(ctx); err != nil || hb.StaleEcho {
				t.Errorf("next fresh beat: %v, %v; want it counted", hb, err)
			}

			// Reports: the one Register uploaded, captured and sent again.
			last, err := b.Store.LatestReport(ctx, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			err = a.UploadRaw(ctx, last.Bytes, last.Signature)
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "replayed") {
				t.Errorf("replayed report: %v, want failed_precondition naming a replay", err)
			}
			// The same replay to a second broker on the same store.
			b2 := brokertest.Start(t, db, brokertest.Fast())
			c2 := b2.Clients(t, tok)
			_, err = c2.Agent.UploadReport(ctx, connect.NewRequest(&gpupassv1.UploadReportRequest{AgentId: a.ID, Report: last.Bytes, Signature: last.Signature}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Errorf("replayed report to a second broker: %v, want failed_precondition", err)
			}
			// A report signed long ago (never delivered, replayed now).
			stale := a.Report()
			stale.GeneratedAt = time.Now().Add(-time.Hour).UTC().Format("2006-01-02T15:04:05.000Z07:00")
			if err := a.Upload(ctx, stale); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "from the broker's clock") {
				t.Errorf("hour-old report: %v, want failed_precondition naming the clock", err)
			}
			// A fresh report is still taken.
			if err := a.Upload(ctx, nil); err != nil {
				t.Errorf("fresh report refused: %v", err)
			}
			if r, err := b.Store.LatestReport(ctx, a.ID); err != nil || bytes.Equal(r.Bytes, last.Bytes) {
				t.Errorf("the fresh report is not the stored one: %v", err)
			}

			log := logs.String()
			for _, want := range []string{"refused heartbeat: replayed or out of order", "refused heartbeat: bad signature",
				"rejected conformance report", "a replayed or out-of-order report"} {
				if !strings.Contains(log, want) {
					t.Errorf("broker log lacks %q:\n%s", want, log)
				}
			}
		})
	}
}
