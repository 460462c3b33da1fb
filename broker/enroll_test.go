package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestReenrollCrossesScope: public keys are public (audit zips hold
// them), so an agent token of another region that enrolls a known key
// again must not move the node into its own scope, take its runs, or
// lock the real node out.
func TestReenrollCrossesScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	usTok, euTok := b.Token(t, store.RoleAgent, "us-*"), b.Token(t, store.RoleAgent, "eu-*")
	victim := newWorker(t, b, usTok, brokertest.H100("us-west-2", 20))
	victim.keepAlive(t)
	submit(t, dialRuns(t, b, b.Token(t, store.RoleSubmit, "*")), "us-west-2", nil)
	for _, enroll := range []func(context.Context, string, string, *ecdsa.PrivateKey, brokertest.NodeSpec) (*brokertest.Agent, error){brokertest.Enroll, brokertest.EnrollProven} {
		_, err := enroll(ctx, b.URL, euTok, victim.Key, brokertest.H100("eu-central-1", 20))
		if brokertest.Code(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "in us-west-2, outside the scope") || !strings.Contains(err.Error(), "into eu-central-1") {
			t.Errorf("eu-* token re-enrolled a us-west-2 node: %v, want permission_denied naming both regions", err)
		}
	}
	// Even with the node's own credentials, an eu-* token may not act for it.
	_, err := victim.Runs(t, b.URL, euTok).Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: victim.ID, WaitSeconds: 1}))
	if brokertest.Code(err) != connect.CodePermissionDenied {
		t.Errorf("eu-* token polling for the us-west-2 node's work: %v, want permission_denied", err)
	}
	if err := victim.Upload(ctx, nil); err != nil {
		t.Errorf("real node locked out: %v", err)
	}
}

// TestReenrollChangesNeedProof: a token that covers the node may enroll
// its key again unchanged without a proof (agents before session keys do
// on every restart), but moving it or changing its labels needs a recent
// proof of key possession.
func TestReenrollChangesNeedProof(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleAgent, "*")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	node := brokertest.H100("us-west-2", 20)
	a, err := brokertest.Enroll(ctx, b.URL, tok, key, node)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := brokertest.Enroll(ctx, b.URL, tok, key, node); err != nil || again.ID != a.ID {
		t.Fatalf("unproven enrollment, labels unchanged: %v; want %s again", err, a.ID)
	}
	for _, n := range []brokertest.NodeSpec{brokertest.H100("eu-central-1", 20), brokertest.H100("us-west-2", 1)} {
		_, err := brokertest.Enroll(ctx, b.URL, tok, key, n)
		if brokertest.Code(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "needs a recent proof of key possession") {
			t.Errorf("unproven enrollment into %s at %v/h: %v, want permission_denied asking for a proof", n.Region, n.Price, err)
		}
	}
	moved := brokertest.H100("eu-central-1", 18)
	got, err := brokertest.EnrollProven(ctx, b.URL, tok, key, moved)
	if err != nil || got.ID != a.ID {
		t.Fatalf("proven enrollment into eu-central-1: %v; want %s moved", err, a.ID)
	}
	// The node is where the proven enrollment put it: a us-* token no
	// longer reaches it, an eu-* one does.
	for _, c := range []struct {
		scope string
		code  connect.Code
	}{{"us-*", connect.CodePermissionDenied}, {"eu-*", 0}} {
		req, err := got.BeatRequest()
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.Clients(t, b.Token(t, store.RoleAgent, c.scope)).Agent.Heartbeat(ctx, connect.NewRequest(req))
		if (c.code == 0) != (err == nil) || (err != nil && brokertest.Code(err) != c.code) {
			t.Errorf("beat through a %s token after the move: %v, want code %v", c.scope, err, c.code)
		}
	}
}

// TestReenrollShowsOnOtherReplicas: a node moved to another region
// through one broker is seen there by another broker on the same store
// within AgentTTL; its cached copy does not keep the old region (and so
// the old scope) until a restart.
func TestReenrollShowsOnOtherReplicas(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg := brokertest.Fast()
			cfg.AgentTTL = 200 * time.Millisecond
			db := brokertest.NewDB(t, kind)
			b1, b2 := brokertest.Start(t, db, cfg), brokertest.Start(t, db, cfg)
			all, eu := b1.Token(t, store.RoleAgent, "*"), b1.Token(t, store.RoleAgent, "eu-*")
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			node := brokertest.H100("us-west-2", 20)
			a, err := brokertest.EnrollProven(ctx, b1.URL, all, key, node)
			if err != nil {
				t.Fatal(err)
			}
			poll := func(tok string) error {
				_, err := a.Runs(t, b2.URL, tok).Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: a.ID, WaitSeconds: 1}))
				return err
			}
			if err := poll(all); err != nil { // b2 now holds the agent in us-west-2
				t.Fatal(err)
			}
			node.Region = "eu-central-1"
			if a, err = brokertest.EnrollProven(ctx, b1.URL, all, key, node); err != nil {
				t.Fatalf("moving the node through b1: %v", err)
			}
			// b2 sees the move once its copy is older than AgentTTL.
			deadline := time.Now().Add(10 * time.Second)
			for err := poll(eu); err != nil; err = poll(eu) {
				if time.Now().After(deadline) {
					t.Fatalf("an eu-* token polling for the moved node through b2, 10 s after the move: %v", err)
				}
				time.Sleep(cfg.AgentTTL / 4)
			}
		})
	}
}

// TestEnrollRefusesBadRegion: an agent's region follows the rule of a
// run's (api.CheckRegion), so no node sits in a region no run can name.
func TestEnrollRefusesBadRegion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	tok := b.Token(t, store.RoleAgent, "*")
	for _, region := range []string{"us-west-2,eu-central-1", "US-West-2", "us west"} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		_, err = brokertest.Enroll(ctx, b.URL, tok, key, brokertest.H100(region, 20))
		if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "lowercase letters, digits and '-'") {
			t.Errorf("enrolling in region %q: %v, want invalid_argument naming the rule", region, err)
		}
	}
}
