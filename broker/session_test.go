package broker_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
)

// TestSessionKeys: a proven enrollment gets a heartbeat session key that
// every replica on the store accepts; a re-enrollment rotates it and the
// old key is refused; a bad mac, an unknown epoch and a bad or stale
// proof are refused with errors that say what to do; keys never reach
// the logs; agents that sign beats (no session key) stay accepted.
func TestSessionKeys(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			cfg := brokertest.Fast()
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg.SessionKeyTTL = 300 * time.Millisecond
			db := brokertest.NewDB(t, kind)
			b1 := brokertest.Start(t, db, cfg)
			b2 := brokertest.Start(t, db, cfg)
			tok := b1.Token(t, store.RoleAgent, "*")
			ctx := context.Background()
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			node := brokertest.H100("us-west-2", 20)
			a, err := brokertest.EnrollProven(ctx, b1.URL, tok, key, node)
			if err != nil {
				t.Fatalf("proven enrollment: %v", err)
			}
			if len(a.SessionKey) != api.SessionKeyBytes || a.SessionEpoch != 1 {
				t.Fatalf("session key of %d bytes, epoch %d; want %d bytes, epoch 1", len(a.SessionKey), a.SessionEpoch, api.SessionKeyBytes)
			}
			keys := [][]byte{a.SessionKey}
			// beat sends req, and again with key when the replica
			// holds only its verifier and asks for it.
			beat := func(b *brokertest.Broker, req *gpupassv1.HeartbeatRequest, key []byte) (*gpupassv1.HeartbeatResponse, error) {
				return b.Clients(t, tok).Heartbeat(ctx, req, key)
			}
			// Beats with the key count, through either replica.
			if hb, err := a.Beat(ctx); err != nil || hb.StaleEcho {
				t.Fatalf("beat with the session key: %v, %v; want it counted", hb, err)
			}
			req, err := a.BeatRequest()
			if err != nil {
				t.Fatal(err)
			}
			if req.Signature != "" || len(req.Mac) == 0 {
				t.Fatalf("beat with a session key carries signature %q and a %d-byte mac; want only the mac", req.Signature, len(req.Mac))
			}
			// The other replica holds only the key's verifier: it asks
			// for the key, refuses a wrong one, and takes the right one.
			if _, err := beat(b2, req, nil); connect.CodeOf(err) != connect.CodeUnauthenticated || !api.SessionKeyWanted(err) {
				t.Fatalf("beat with a key issued by the other replica, key not sent: %v; want unauthenticated asking for the key", err)
			}
			wrong := bytes.Clone(a.SessionKey)
			wrong[0] ^= 1
			if _, err := beat(b2, req, wrong); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "not the one issued") {
				t.Fatalf("beat with a key issued by the other replica, a wrong key sent: %v; want permission_denied", err)
			}
			if _, err := beat(b2, req, a.SessionKey); err != nil {
				t.Fatalf("beat with a key issued by the other replica: %v", err)
			}
			// Shown once: the replica keeps it.
			req, _ = a.BeatRequest()
			if _, err := beat(b2, req, nil); err != nil {
				t.Fatalf("second beat through the other replica, key not sent: %v", err)
			}
			// A bad mac, and a mac naming an epoch never issued.
			bad, _ := a.BeatRequest()
			bad.Mac[0] ^= 1
			if _, err := beat(b1, bad, a.SessionKey); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "mac does not verify") || !strings.Contains(err.Error(), "enroll again") {
				t.Errorf("beat with a bad mac: %v, want permission_denied saying to enroll again", err)
			}
			future, _ := a.BeatRequest()
			future.SessionEpoch = 99
			future.Mac = api.HeartbeatMAC(a.SessionKey, future)
			if _, err := beat(b2, future, a.SessionKey); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "epoch 99 is not the current one") {
				t.Errorf("beat naming epoch 99: %v, want permission_denied naming the epoch", err)
			}

			// Re-enrolling (an agent restart) through the other replica
			// rotates the key: same agent, new key, next epoch.
			a2, err := brokertest.EnrollProven(ctx, b2.URL, tok, key, node)
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, a2.SessionKey)
			if a2.ID != a.ID || a2.SessionEpoch != 2 || bytes.Equal(a2.SessionKey, a.SessionKey) {
				t.Fatalf("re-enrollment: agent %s epoch %d, new key %v; want %s, epoch 2, a new key", a2.ID, a2.SessionEpoch, !bytes.Equal(a2.SessionKey, a.SessionKey), a.ID)
			}
			old, _ := a.BeatRequest()
			if _, err := beat(b2, old, a.SessionKey); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "epoch 1 is not the current one (2)") {
				t.Errorf("beat with the rotated-out key: %v, want permission_denied", err)
			}
			// The replica that cached epoch 1 takes epoch 2 from the store.
			a2.SetCounter(old.Counter)
			if _, err := a2.Beat(ctx); err != nil {
				t.Errorf("beat with the new key through the replica that issued it: %v", err)
			}
			next, _ := a2.BeatRequest()
			if _, err := beat(b1, next, a2.SessionKey); err != nil {
				t.Errorf("beat with the new key through the other replica: %v", err)
			}

			// A third key, issued through b2: b1 may take the second
			// key until its cached copy is SessionKeyTTL old, not after.
			a3, err := brokertest.EnrollProven(ctx, b2.URL, tok, key, node)
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, a3.SessionKey)
			time.Sleep(500 * time.Millisecond) // SessionKeyTTL and the reload interval
			retired, _ := a2.BeatRequest()
			retired.Counter = next.Counter + 5
			retired.Mac = api.HeartbeatMAC(a2.SessionKey, retired)
			if _, err := beat(b1, retired, a2.SessionKey); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "epoch 2 is not the current one (3)") {
				t.Errorf("beat with a key rotated through the other replica, after the TTL: %v, want permission_denied", err)
			}
			a2 = a3
			a2.SetCounter(next.Counter + 5)
			next, _ = a2.BeatRequest()
			if _, err := beat(b1, next, a2.SessionKey); err != nil {
				t.Errorf("beat with the third key: %v", err)
			}

			// A proof by another key is refused; an enrollment without a
			// proof, or with a proof too old (a replay, or a wrong clock),
			// gets no key (it signs beats), and its signed beats are taken
			// as before.
			pem, _ := conformance.PublicKeyPEM(key)
			fp, _ := api.KeyFingerprint(&key.PublicKey)
			other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			labels := node.Labels() // unchanged: an unproven enrollment may not change them
			now := time.Now().UnixNano()
			forged, _ := conformance.Sign(other, api.EnrollProofPayload(fp, now))
			stale := time.Now().Add(-time.Hour).UnixNano()
			staleProof, _ := conformance.Sign(key, api.EnrollProofPayload(fp, stale))
			c := b1.Clients(t, tok)
			for _, tc := range []struct {
				name  string
				req   *gpupassv1.EnrollRequest
				wants string
			}{
				{"forged proof", &gpupassv1.EnrollRequest{PublicKeyPem: pem, Labels: labels, Proof: forged, ProofTimeUnixNano: now}, "does not verify"},
				{"proof of another time", &gpupassv1.EnrollRequest{PublicKeyPem: pem, Labels: labels, Proof: staleProof, ProofTimeUnixNano: now}, "does not verify"},
			} {
				if _, err := c.Agent.Enroll(ctx, connect.NewRequest(tc.req)); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), tc.wants) {
					t.Errorf("%s: %v, want permission_denied containing %q", tc.name, err, tc.wants)
				}
			}
			resp, err := c.Agent.Enroll(ctx, connect.NewRequest(&gpupassv1.EnrollRequest{PublicKeyPem: pem, Labels: labels, Proof: staleProof, ProofTimeUnixNano: stale}))
			if err != nil || resp.Msg.AgentId != a.ID || len(resp.Msg.SessionKey) != 0 || resp.Msg.SessionEpoch != 0 {
				t.Errorf("enrollment with an hour-old proof: %v, %v; want %s enrolled without a session key", resp, err, a.ID)
			}
			legacy, err := brokertest.Enroll(ctx, b1.URL, tok, key, node)
			if err != nil {
				t.Fatal(err)
			}
			if legacy.SessionKey != nil || legacy.ID != a.ID {
				t.Errorf("enrollment without proof: agent %s with a session key %v; want %s without one", legacy.ID, legacy.SessionKey != nil, a.ID)
			}
			legacy.SetCounter(next.Counter)
			if _, err := legacy.Beat(ctx); err != nil {
				t.Errorf("signed beat: %v", err)
			}
			// ... and it did not retire the proven agent's key.
			again, _ := a2.BeatRequest()
			again.Counter = next.Counter + 10
			again.Mac = api.HeartbeatMAC(a2.SessionKey, again)
			if _, err := beat(b1, again, a2.SessionKey); err != nil {
				t.Errorf("beat with the current key after an unproven enrollment: %v", err)
			}

			log := logs.String()
			for _, want := range []string{"refused heartbeat: bad mac", "refused heartbeat: not the current session key", "refused enrollment", "enrollment proof time too far"} {
				if !strings.Contains(log, want) {
					t.Errorf("broker log lacks %q", want)
				}
			}
			for _, k := range keys {
				for _, enc := range []string{hex.EncodeToString(k), base64.StdEncoding.EncodeToString(k), base64.RawURLEncoding.EncodeToString(k), string(k)} {
					if strings.Contains(log, enc) {
						t.Errorf("broker log holds a session key")
					}
				}
			}
		})
	}
}

// TestReenrollWhileServing: an agent that enrolls again (a restart) while
// its earlier instance still beats and uploads reports. Enroll replaces
// the cached identity the other requests read; under the race detector
// (make test) this fails if any of them reads it without the lock.
func TestReenrollWhileServing(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "sqlite")
	b := brokertest.Start(t, db, brokertest.Fast())
	tok := b.Token(t, store.RoleAgent, "*")
	ctx := context.Background()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	node := brokertest.H100("us-west-2", 20)
	// Signed beats (no session key): they read the enrolled public key.
	a, err := brokertest.Enroll(ctx, b.URL, tok, key, node)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for range 20 {
			if _, err := brokertest.Enroll(ctx, b.URL, tok, key, node); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range 20 {
		if _, err := a.Beat(ctx); err != nil {
			t.Fatalf("beat %d while the agent enrolls again: %v", i, err)
		}
		if err := a.Upload(ctx, nil); err != nil {
			t.Fatalf("report %d while the agent enrolls again: %v", i, err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("enrolling again: %v", err)
	}
}

// keyShown counts the requests that carry the session key itself.
type keyShown struct {
	next  http.RoundTripper
	shown atomic.Int32
}

func (k *keyShown) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get(api.SessionKeyHeader) != "" {
		k.shown.Add(1)
	}
	return k.next.RoundTrip(req)
}

// TestAgentCallShowsKeyOnce: the store keeps only session key verifiers
// (issue #31), so a replica that did not issue a key asks for it. An
// agent's work call MACed with a key issued through b1 goes through b2:
// the agent's transport sends the key once, b2 checks it against the
// verifier and keeps it, and later calls carry only MACs. A key that is
// not the one issued is refused.
func TestAgentCallShowsKeyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := brokertest.NewDB(t, "sqlite")
	b1 := brokertest.Start(t, db, brokertest.Fast())
	b2 := brokertest.Start(t, db, brokertest.Fast())
	tok := b1.Token(t, store.RoleAgent, "*")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a, err := brokertest.EnrollProven(ctx, b1.URL, tok, key, brokertest.H100("us-west-2", 20))
	if err != nil {
		t.Fatal(err)
	}
	poll := &gpupassv1.PollWorkRequest{AgentId: a.ID, WaitSeconds: 0}
	count := &keyShown{next: client.HTTPClient(false, nil).Transport}
	onB2 := dialWithTransport(t, b2.URL, tok, a.Creds.Transport(count))
	for i := range 3 {
		if _, err := onB2.Work.PollWork(ctx, connect.NewRequest(poll)); err != nil {
			t.Fatalf("work call %d through the replica that did not issue the key: %v", i+1, err)
		}
	}
	if n := count.shown.Load(); n != 1 {
		t.Errorf("the key was sent %d times over 3 calls, want once", n)
	}

	// A wrong key shown to a replica that holds only the verifier (b3
	// has cached nothing) is refused.
	b3 := brokertest.Start(t, db, brokertest.Fast())
	wrong := bytes.Clone(a.SessionKey)
	wrong[0] ^= 1
	forged := &api.AgentCredentials{}
	forged.Set(a.ID, wrong, a.SessionEpoch, 0)
	onB3 := dialWithTransport(t, b3.URL, tok, forged.Transport(client.HTTPClient(false, nil).Transport))
	if _, err := onB3.Work.PollWork(ctx, connect.NewRequest(poll)); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "not the one issued") {
		t.Errorf("work call with a wrong key shown: %v, want permission_denied", err)
	}
}
