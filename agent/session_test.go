package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/conformance"
)

// TestSessionKeyRecovery: a running agent beats with its session key;
// when the key is rotated behind its back (here: another proven
// enrollment of the same identity key), its next beat is refused, and it
// enrolls again for a new key and keeps beating.
func TestSessionKeyRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, st := startBroker(t)
	sk, ok := st.(store.SessionKeys)
	if !ok {
		t.Fatalf("%T keeps no session keys", st)
	}
	tok := token(t, st, store.RoleAgent, "*")
	dir := t.TempDir()
	startAgent(t, url, tok, dir, node{"h100-sxm5-8x", "us-west-2", 90})

	id := ""
	epoch := waitValue(t, "the agent's first session key", func() (uint64, bool) {
		b, err := readState(dir)
		if err != nil || b == "" {
			return 0, false
		}
		id = b
		_, e, err := sk.SessionVerifier(ctx, id)
		return e, err == nil && e >= 1
	})
	key, err := conformance.LoadOrCreateKey(filepath.Join(dir, agent.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	other, err := brokertest.EnrollProven(ctx, url, tok, key, brokertest.H100("us-west-2", 90))
	if err != nil {
		t.Fatal(err)
	}
	if other.ID != id || other.SessionEpoch != epoch+1 {
		t.Fatalf("second enrollment: agent %s epoch %d, want %s epoch %d", other.ID, other.SessionEpoch, id, epoch+1)
	}
	// The agent's beat with the old key is refused; it enrolls again.
	waitValue(t, "the agent to enroll again for a new key", func() (uint64, bool) {
		_, e, err := sk.SessionVerifier(ctx, id)
		return e, err == nil && e > other.SessionEpoch
	})
	// ... and its beats with the new key are taken.
	since := time.Now()
	waitValue(t, "a heartbeat with the new key", func() (uint64, bool) {
		hbs, err := st.Liveness(ctx, since)
		for _, hb := range hbs {
			if hb.AgentID == id && err == nil {
				return 1, true
			}
		}
		return 0, false
	})
}

// readState returns the agent id the agent keeps in its state dir.
func readState(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, agent.StateFile))
	if err != nil {
		return "", err
	}
	var p struct {
		AgentID string `json:"agent_id"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return "", err
	}
	return p.AgentID, nil
}

func waitValue(t *testing.T, what string, f func() (uint64, bool)) uint64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if v, ok := f(); ok {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
