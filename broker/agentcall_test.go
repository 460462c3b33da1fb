package broker_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
)

// TestAgentCallsProveTheNode: an agent token is shared by a fleet, and
// agent ids are listed to every read token. Another node holding the same
// token (or anyone with an agent token and a victim's id) must not poll the
// victim's work, report its run, upload its records, hand in its run
// report, or keep it online; a captured call must not replay.
func TestAgentCallsProveTheNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := brokertest.Fast()
	cfg.OfflineAfter = 3 * time.Second
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	tok := b.Token(t, store.RoleAgent, "*")
	victim := newWorker(t, b, tok, brokertest.H100("us-west-2", 20))
	stopVictim := victim.keepAlive(t)
	mallory := newWorker(t, b, tok, brokertest.H100("eu-central-1", 20))
	mallory.keepAlive(t)
	sub := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	run := submit(t, sub, "us-west-2", nil)
	if run.NodeId != victim.ID {
		t.Fatalf("placed on %s, want %s", run.NodeId, victim.ID)
	}

	// Mallory's own, valid credentials, naming the victim.
	as := &gpupassv1.Assignment{AllocId: run.Id, FencingToken: run.FencingToken}
	posing := &worker{Agent: &brokertest.Agent{ID: victim.ID}, runs: mallory.Runs(t, b.URL, tok)}
	// A header that claims the victim, signed with Mallory's key.
	forged := &api.AgentCredentials{Sign: func(p []byte) (string, error) { return conformance.Sign(mallory.Key, p) }}
	forged.Set(victim.ID, nil, 0, time.Now().UnixNano())
	claiming := &worker{Agent: &brokertest.Agent{ID: victim.ID}, runs: dialWith(t, b.URL, tok, forged)}
	// A token and nothing else, as before.
	bare := &worker{Agent: &brokertest.Agent{ID: victim.ID}, runs: dialRuns(t, b, tok)}

	for _, c := range []struct {
		name string
		w    *worker
		code connect.Code
		msg  string
	}{
		{"own credentials naming the victim", posing, connect.CodePermissionDenied, "names agent " + `"` + victim.ID + `"` + " but the call was made by " + mallory.ID},
		{"the victim's id signed with another key", claiming, connect.CodePermissionDenied, "does not verify against the key enrolled for " + victim.ID},
		{"a token alone", bare, connect.CodeUnauthenticated, "must prove the node's identity"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				if brokertest.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
					t.Errorf("%s: %v, want %s containing %q", what, err, c.code, c.msg)
				}
			}
			_, err := c.w.runs.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: victim.ID, WaitSeconds: 1}))
			check("polling the victim's work", err)
			_, err = c.w.update(as, gpupassv1.AllocState_ALLOC_STATE_FAILED, "forged failure", 0)
			check("failing the victim's run", err)
			_, err = c.w.upload(as, records(100, 102))
			check("records at future seqs", err)
			_, err = c.w.runs.Work.SubmitRunReport(ctx, connect.NewRequest(&gpupassv1.SubmitRunReportRequest{AgentId: victim.ID, AllocId: run.Id, FencingToken: run.FencingToken, Report: []byte("{}"), Signature: "x"}))
			check("handing in a run report", err)
		})
	}

	// The genuine node still works, and its run is untouched.
	got := victim.poll(t, 5)
	if got == nil || got.AllocId != run.Id {
		t.Fatalf("the victim's own poll: %v, want %s", got, run.Id)
	}
	if _, err := victim.update(got, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
		t.Fatal(err)
	}
	if held, err := victim.upload(got, records(1, 3)); err != nil || held != 3 {
		t.Fatalf("the victim's upload: %d, %v", held, err)
	}
	if r := getRun(t, sub, run.Id); r.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING || r.HeldThrough != 3 {
		t.Errorf("run after the attempts: %s held through %d, want running held through 3", r.State, r.HeldThrough)
	}

	// A captured call replayed as it was: refused, counter taken.
	rec := &recorder{next: client.HTTPClient(false, nil).Transport}
	victimCalls := dialWithTransport(t, b.URL, tok, victim.Creds.Transport(rec))
	if _, err := victimCalls.Work.UploadRecords(ctx, connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: victim.ID, AllocId: run.Id, FencingToken: got.FencingToken, Records: records(4, 4)})); err != nil {
		t.Fatal(err)
	}
	status, body := rec.replay(t)
	if status == http.StatusOK || !strings.Contains(body, `"aborted"`) || !strings.Contains(body, "was taken before") {
		t.Errorf("replayed call: %d %s, want aborted: counter taken before", status, body)
	}

	// A call made with an echoed broker time older than the window (made
	// long ago, or kept back across a broker restart that forgot the
	// counters) is refused as it was sent; the genuine agent, told so,
	// makes it again with the broker time of the refusal.
	rec.mu.Lock()
	hdr := rec.req.Header.Get(api.AgentCallHeader)
	rec.mu.Unlock()
	call, err := api.ParseAgentCall(hdr)
	if err != nil {
		t.Fatal(err)
	}
	oldCall := api.AgentCall{AgentID: victim.ID, Counter: call.Counter + 1, Echo: time.Now().Add(-time.Hour).UnixNano()}
	status, body = rec.send(t, oldCall, victim.Creds)
	if status == http.StatusOK || !strings.Contains(body, `"aborted"`) || !strings.Contains(body, "echoes") {
		t.Errorf("stale echo: %d %s, want aborted", status, body)
	}
	old := &api.AgentCredentials{Sign: func(p []byte) (string, error) { return conformance.Sign(victim.Key, p) }}
	old.Set(victim.ID, victim.SessionKey, victim.SessionEpoch, time.Now().Add(-time.Hour).UnixNano())
	if _, err := dialWith(t, b.URL, tok, old).Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: victim.ID, WaitSeconds: 1})); err != nil {
		t.Errorf("an agent back from a partition (old echo): %v, want its call to go through on the second try", err)
	}

	// Liveness comes only from proven calls: Mallory polling for the
	// silent victim does not keep it online.
	stopVictim()
	read := b.Clients(t, b.Token(t, store.RoleRead, "*"))
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _ = posing.runs.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: victim.ID, WaitSeconds: 1}))
		_, _ = bare.runs.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: victim.ID, WaitSeconds: 1}))
		nodes, err := read.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
		if err != nil {
			t.Fatal(err)
		}
		online := true
		for _, n := range nodes.Msg.Nodes {
			if n.Id == victim.ID {
				online = n.Online
			}
		}
		if !online {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the silent victim stayed online while another node polled in its name")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAgentCallSignedWithoutSessionKey: an agent enrolled without a proof
// (no session key) signs each call with its identity key; that works,
// and the same call with the wrong key does not.
func TestAgentCallSignedWithoutSessionKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleAgent, "*")
	w := newWorker(t, b, tok, brokertest.H100("us-west-2", 20))
	if w.SessionKey != nil {
		t.Fatal("brokertest.Register enrolled with a session key; this test wants one without")
	}
	if _, err := w.runs.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: w.ID, WaitSeconds: 1})); err != nil {
		t.Fatalf("signed call: %v", err)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	wrong := &api.AgentCredentials{Sign: func(p []byte) (string, error) { return conformance.Sign(other, p) }}
	wrong.Set(w.ID, nil, 0, time.Now().UnixNano())
	_, err = dialWith(t, b.URL, tok, wrong).Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: w.ID, WaitSeconds: 1}))
	if brokertest.Code(err) != connect.CodePermissionDenied {
		t.Errorf("call signed with another key: %v, want permission_denied", err)
	}
}

func dialWith(t *testing.T, url, tok string, creds *api.AgentCredentials) *client.RunClients {
	t.Helper()
	c, err := client.DialRuns(url, client.Options{Token: tok, GRPC: true, Agent: creds})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialWithTransport dials the work service over the Connect protocol
// (plain HTTP answers, easy to replay) through tr.
func dialWithTransport(t *testing.T, url, tok string, tr http.RoundTripper) *client.RunClients {
	t.Helper()
	auth := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(api.AuthHeader, "Bearer "+tok)
			return next(ctx, req)
		}
	})
	return &client.RunClients{Work: gpupassv1connect.NewAgentWorkServiceClient(&http.Client{Transport: tr}, url, connect.WithInterceptors(auth))}
}

// recorder keeps the last request it sent, to send it again as it was.
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	req  *http.Request
	body []byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.req, r.body = req.Clone(context.Background()), b
	r.mu.Unlock()
	req.Body = io.NopCloser(bytes.NewReader(b))
	return r.next.RoundTrip(req)
}

// send sends the recorded request again with a new proof made of call,
// signed with the identity key behind creds.
func (r *recorder) send(t *testing.T, call api.AgentCall, creds *api.AgentCredentials) (int, string) {
	t.Helper()
	r.mu.Lock()
	req := r.req.Clone(context.Background())
	body := r.body
	r.mu.Unlock()
	sum := sha256.Sum256(body)
	sig, err := creds.Sign(api.AgentCallPayload(req.URL.Path, call, sum[:]))
	if err != nil {
		t.Fatal(err)
	}
	call.Sig = sig
	req.Header.Set(api.AgentCallHeader, call.String())
	req.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *recorder) replay(t *testing.T) (int, string) {
	t.Helper()
	r.mu.Lock()
	req := r.req.Clone(context.Background())
	req.Body = io.NopCloser(bytes.NewReader(r.body))
	r.mu.Unlock()
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
