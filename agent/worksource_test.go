package agent

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/client"
)

// seqBroker is an AgentWorkService that stores records by seq and
// answers the gap-free prefix, as the broker does.
type seqBroker struct {
	gpupassv1connect.UnimplementedAgentWorkServiceHandler
	mu   sync.Mutex
	seqs map[uint64]bool
}

func (b *seqBroker) UploadRecords(_ context.Context, r *connect.Request[gpupassv1.UploadRecordsRequest]) (*connect.Response[gpupassv1.UploadRecordsResponse], error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, rec := range r.Msg.Records {
		if len(rec.Data) == 0 {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("records[%d]: data is empty", i))
		}
	}
	for _, rec := range r.Msg.Records {
		b.seqs[rec.Seq] = true
	}
	var held uint64
	for b.seqs[held+1] {
		held++
	}
	return connect.NewResponse(&gpupassv1.UploadRecordsResponse{HeldThrough: held}), nil
}

// A batch the broker refuses as invalid is refused for good: the sink
// says so (uploader.ErrRefused), so the uploader stops instead of sending
// the same records until the agent stops.
func TestRecordSinkInvalidBatchIsRefused(t *testing.T) {
	t.Parallel()
	sink := seqSink(t, &seqBroker{seqs: map[uint64]bool{}}, 0)
	_, err := sink.Upload(context.Background(), "alloc-00000001", []spool.Record{{Seq: 1, Kind: spool.KindEvent, Data: []byte(`{}`)}, {Seq: 2, Kind: spool.KindEvent}})
	if !errors.Is(err, uploader.ErrRefused) || errors.Is(err, ErrStaleLease) {
		t.Errorf("invalid batch: %v, want uploader.ErrRefused (and not a stale lease)", err)
	}
}

// serveGRPC serves h on loopback over HTTP/1.1 and unencrypted HTTP/2
// (gRPC, as the agent speaks it) until the test ends.
func serveGRPC(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// seqSink serves b over gRPC, as the broker does, and returns a sink
// for a run resumed after seq resumeAfter.
func seqSink(t *testing.T, b *seqBroker, resumeAfter uint64) uploader.Sink {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(gpupassv1connect.NewAgentWorkServiceHandler(b))
	srv := serveGRPC(t, mux)
	src, err := NewBrokerSource(srv.URL, client.Options{Token: "tok"}, func() string { return "agt-1" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return src.Sink(&Assignment{AllocID: "alloc-00000001", FencingToken: 2, ResumeAfterSeq: resumeAfter})
}

// A run resumed on this node after its first node was lost continues the
// broker's sequence: the spool's seq 1 is stored as ResumeAfterSeq+1, and
// the uploader sees held-through in its own numbering.
func TestRecordSinkContinuesAfterResume(t *testing.T) {
	t.Parallel()
	b := &seqBroker{seqs: map[uint64]bool{}}
	for s := uint64(1); s <= 12; s++ {
		b.seqs[s] = true // held from the lost node
	}
	sink := seqSink(t, b, 12)
	held, err := sink.Upload(context.Background(), "alloc-00000001", []spool.Record{{Seq: 1, Kind: spool.KindEvent, Data: []byte(`{}`)}, {Seq: 2, Kind: spool.KindEvent, Data: []byte(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if held != 2 {
		t.Errorf("held through %d in the spool's numbering, want 2", held)
	}
	if !b.seqs[13] || !b.seqs[14] || len(b.seqs) != 14 {
		t.Errorf("broker holds %v, want 1..14", b.seqs)
	}
}

// badIDBroker hands out a run whose id is not a plain name and records
// the updates it gets.
type badIDBroker struct {
	gpupassv1connect.UnimplementedAgentWorkServiceHandler
	id      string
	mu      sync.Mutex
	updates []*gpupassv1.UpdateAllocationRequest
}

func (b *badIDBroker) PollWork(context.Context, *connect.Request[gpupassv1.PollWorkRequest]) (*connect.Response[gpupassv1.PollWorkResponse], error) {
	return connect.NewResponse(&gpupassv1.PollWorkResponse{Assignment: &gpupassv1.Assignment{AllocId: b.id, FencingToken: 7, Command: []string{"true"}}}), nil
}

func (b *badIDBroker) UpdateAllocation(_ context.Context, r *connect.Request[gpupassv1.UpdateAllocationRequest]) (*connect.Response[gpupassv1.UpdateAllocationResponse], error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.updates = append(b.updates, r.Msg)
	return connect.NewResponse(&gpupassv1.UpdateAllocationResponse{}), nil
}

// TestUnsafeAllocIDFromTheBroker: a run whose id could not name a
// directory safely, polled from the broker, is refused by the run loop
// before anything is named after it; the broker hears that it failed and
// why.
func TestUnsafeAllocIDFromTheBroker(t *testing.T) {
	t.Parallel()
	b := &badIDBroker{id: ".."}
	mux := http.NewServeMux()
	mux.Handle(gpupassv1connect.NewAgentWorkServiceHandler(b))
	srv := serveGRPC(t, mux)
	src, err := NewBrokerSource(srv.URL, client.Options{Token: "tok"}, func() string { return "agt-1" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := src.PollWork(t.Context(), "agt-1")
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	l := &RunLoop{Source: src, AgentID: func() string { return "agt-1" }, StateDir: state,
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}}
	if final := l.RunAssignment(t.Context(), a); final.State != StateFailed || !strings.Contains(final.Reason, `allocation id ".." is not a plain name`) {
		t.Errorf("final %s (%s), want failed naming the id", final.State, final.Reason)
	}
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Errorf("the state dir holds %d entries after a refused run", len(ents))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.updates) != 1 || b.updates[0].AllocId != ".." || b.updates[0].FencingToken != 7 ||
		b.updates[0].State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(b.updates[0].Reason, "not a plain name") {
		t.Errorf("updates %v, want one FAILED for .. under token 7 saying why", b.updates)
	}
}

// pollBroker answers polls with no run, counting them.
type pollBroker struct {
	gpupassv1connect.UnimplementedAgentWorkServiceHandler
	polled chan struct{}
}

func (b *pollBroker) PollWork(ctx context.Context, _ *connect.Request[gpupassv1.PollWorkRequest]) (*connect.Response[gpupassv1.PollWorkResponse], error) {
	select {
	case b.polled <- struct{}{}:
	default:
	}
	select { // a long poll that ends empty
	case <-ctx.Done():
	case <-time.After(50 * time.Millisecond):
	}
	return connect.NewResponse(&gpupassv1.PollWorkResponse{}), nil
}

// TestRunLoopTrustsTLSCA: a broker whose certificate only --tls-ca
// trusts (a private CA, a self-signed broker) is polled for work by the
// agent's run loop, as it is enrolled with and heartbeaten.
func TestRunLoopTrustsTLSCA(t *testing.T) {
	t.Parallel()
	b := &pollBroker{polled: make(chan struct{}, 1)}
	path, h := gpupassv1connect.NewAgentWorkServiceHandler(b)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	o := &Options{BrokerURL: srv.URL, Token: "tok", TLSCA: ca, StateDir: t.TempDir(), Python: "python3"}

	// The work source as the agent builds it.
	conf, err := o.tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewBrokerSource(o.BrokerURL, client.Options{Token: o.Token, TLSConfig: conf}, func() string { return "agt-1" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := src.PollWork(t.Context(), "agt-1"); a != nil || err != nil {
		t.Fatalf("PollWork = %v, %v; want no run, no error", a, err)
	}
	<-b.polled

	// The agent's own run loop.
	logs := &lockedLog{}
	ag, err := New(o, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	// What enrollment leaves: work calls prove agt-1 (signed: no session key).
	ag.creds.Set("agt-1", nil, 0, time.Now().UnixNano())
	ctx, cancel := context.WithCancel(t.Context())
	wait, err := ag.startRunLoop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		wait()
	}()
	select {
	case <-b.polled:
	case <-time.After(10 * time.Second):
		t.Fatalf("the run loop never reached the broker; agent log:\n%s", logs.String())
	}
}

// lockedLog collects a log written from the run loop's goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// disputeBroker answers every upload as held, with the seqs it was told
// to call disputed.
type disputeBroker struct {
	gpupassv1connect.UnimplementedAgentWorkServiceHandler
	disputed []uint64
}

func (b *disputeBroker) UploadRecords(_ context.Context, r *connect.Request[gpupassv1.UploadRecordsRequest]) (*connect.Response[gpupassv1.UploadRecordsResponse], error) {
	recs := r.Msg.Records
	return connect.NewResponse(&gpupassv1.UploadRecordsResponse{HeldThrough: recs[len(recs)-1].Seq, DisputedSeqs: b.disputed}), nil
}

// Seqs the broker refused as disputed are logged by the agent, at most
// 16 of them: the node's operator learns the run's log is no longer
// proof from the agent too, not only from the run's record.
func TestRecordSinkLogsDisputedSeqs(t *testing.T) {
	t.Parallel()
	disputed := make([]uint64, 40)
	for i := range disputed {
		disputed[i] = uint64(100 + i)
	}
	mux := http.NewServeMux()
	mux.Handle(gpupassv1connect.NewAgentWorkServiceHandler(&disputeBroker{disputed: disputed}))
	srv := serveGRPC(t, mux)
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	src, err := NewBrokerSource(srv.URL, client.Options{Token: "tok"}, func() string { return "agt-1" }, log)
	if err != nil {
		t.Fatal(err)
	}
	sink := src.Sink(&Assignment{AllocID: "alloc-00000001", FencingToken: 2})
	recs := make([]spool.Record, 0, 140)
	for i := range 140 {
		recs = append(recs, spool.Record{Seq: uint64(i + 1), Kind: spool.KindEvent, Data: []byte(`{}`)})
	}
	if _, err := sink.Upload(context.Background(), "alloc-00000001", recs); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{`"level":"ERROR"`, `"alloc":"alloc-00000001"`, `"disputed":40`, `"first_seqs":[100,`, `,115]`} {
		if !strings.Contains(out, want) {
			t.Errorf("agent log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "116") {
		t.Errorf("agent log lists more than 16 disputed seqs:\n%s", out)
	}
}
