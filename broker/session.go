package broker

import (
	"context"
	"crypto/ecdsa"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// Heartbeat session keys. An ECDSA P-256 verify costs the broker about
// 100 µs per beat, most of what a beat costs it; an HMAC-SHA256 costs
// about 1 µs. So an enrollment that proves the agent holds its identity
// key (a signature over the key's fingerprint and a recent time) gets a
// random 256-bit session key, and the agent's beats carry an HMAC with it.
//
// The key is random and stored (store.SessionKeys) rather than derived
// from a broker secret with HKDF: replicas sharing a PostgreSQL store need
// no shared secret bootstrapped between them (and no race creating it),
// each rotation is a fresh key with no link to earlier ones, and the
// store row, the only place it is kept, is also what a rotation replaces.
// Its epoch rises with each rotation; a beat names the epoch it used, so
// a replica that has not seen a key another replica issued reads it from
// the store, and a beat with an older key is refused: at once by the
// replica that rotated it, within Config.SessionKeyTTL by the others. A
// key is never logged and never in an error.

// sessionReloadEvery bounds store reads caused by beats naming an epoch
// this replica does not know: at most one per agent per interval.
const sessionReloadEvery = 100 * time.Millisecond

// sessionKeys returns the store's session key table, or nil when the
// store keeps none (agents then sign every beat).
func (b *Broker) sessionKeys() store.SessionKeys {
	sk, _ := b.store.(store.SessionKeys)
	return sk
}

// checkEnrollProof verifies an enrollment's proof of key possession. A
// proof that does not verify is refused; one whose time is too far from
// the broker's clock (a replay, or a node with a wrong clock) only earns
// no session key: the agent then signs its beats, as before session keys.
func checkEnrollProof(pub *ecdsa.PublicKey, fingerprint string, m *gpupassv1.EnrollRequest, now time.Time) (fresh bool, err error) {
	if !verifySig(pub, api.EnrollProofPayload(fingerprint, m.ProofTimeUnixNano), m.Proof) {
		return false, connect.NewError(connect.CodePermissionDenied, errors.New("enrollment proof refused: it does not verify against public_key_pem"))
	}
	d := now.Sub(time.Unix(0, m.ProofTimeUnixNano))
	return m.ProofTimeUnixNano > 0 && d <= api.EnrollProofWindow && d >= -api.EnrollProofWindow, nil
}

// issueSessionKey makes, stores and caches a new session key for e.
func (b *Broker) issueSessionKey(ctx context.Context, sk store.SessionKeys, e *agentEntry) ([]byte, uint64, error) {
	key := make([]byte, api.SessionKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, 0, fmt.Errorf("making a session key: %w", err)
	}
	now := time.Now()
	ag, _ := b.identity(e)
	epoch, err := sk.RotateSessionKey(ctx, ag.ID, key, now)
	if err != nil {
		return nil, 0, err
	}
	b.agentsMu.Lock()
	if epoch >= e.sessEpoch {
		e.sessKey, e.sessEpoch, e.sessLoaded = key, epoch, now
	}
	b.agentsMu.Unlock()
	return key, epoch, nil
}

// sessionKey returns agent id's current session key and epoch, reading
// the store when the caller names a newer epoch than this replica knows
// (another replica issued it) or the cached copy is older than
// SessionKeyTTL. A nil key means the agent has none.
func (b *Broker) sessionKey(ctx context.Context, e *agentEntry, id string, wantEpoch uint64) ([]byte, uint64, error) {
	now := time.Now()
	b.agentsMu.Lock()
	key, epoch, loaded, tried := e.sessKey, e.sessEpoch, e.sessLoaded, e.sessTried
	reload := (wantEpoch > epoch || now.Sub(loaded) > b.cfg.SessionKeyTTL) && now.Sub(tried) >= sessionReloadEvery
	if reload {
		e.sessTried = now
	}
	b.agentsMu.Unlock()
	sk := b.sessionKeys()
	if !reload || sk == nil {
		return key, epoch, nil
	}
	// Issued by another replica, or this copy is old: the store has
	// the current key.
	k, ep, err := sk.SessionKey(ctx, id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		// A store hiccup: the cached key (if it is the caller's) still
		// serves, and a later call reads the store again.
		b.log.Error("reading session key", "agent", id, "err", err)
		if key == nil || wantEpoch != epoch {
			return nil, 0, connect.NewError(connect.CodeUnavailable, errors.New("session key store unavailable"))
		}
		return key, epoch, nil
	}
	if err != nil { // none: the store lost it, or never had it
		k, ep = nil, 0
	}
	b.agentsMu.Lock()
	defer b.agentsMu.Unlock()
	if ep >= e.sessEpoch || ep == 0 {
		e.sessKey, e.sessEpoch, e.sessLoaded = k, ep, now
	}
	return e.sessKey, e.sessEpoch, nil
}

// checkMAC authenticates a heartbeat by its session key HMAC.
func (b *Broker) checkMAC(ctx context.Context, e *agentEntry, m *gpupassv1.HeartbeatRequest, peer string) error {
	key, epoch, err := b.sessionKey(ctx, e, m.AgentId, m.SessionEpoch)
	if err != nil {
		return err
	}
	if key == nil || m.SessionEpoch != epoch {
		b.log.Warn("refused heartbeat: not the current session key", "agent", m.AgentId, "epoch", m.SessionEpoch, "current", epoch, "peer", peer)
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("heartbeat refused: session key epoch %d is not the current one (%d) of %s: enroll again for a new key", m.SessionEpoch, epoch, m.AgentId))
	}
	if !hmac.Equal(api.HeartbeatMAC(key, m), m.Mac) {
		b.log.Warn("refused heartbeat: bad mac", "agent", m.AgentId, "epoch", m.SessionEpoch, "peer", peer)
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("heartbeat refused: its mac does not verify with session key epoch %d of %s: enroll again for a new key", epoch, m.AgentId))
	}
	return nil
}
