package broker

import (
	"bytes"
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
// random 256-bit session key, and the agent's beats and calls carry an
// HMAC with it.
//
// The key is random and kept in memory by the replica that issued it;
// the store (store.SessionKeys) keeps only its verifier
// (api.SessionKeyVerifier) and epoch. A copy of the database (a SQLite
// file another local user could read, a PostgreSQL dump, a backup) was
// enough to make a node's MACs while the store held keys (issue #31); a
// verifier makes none. The key is neither derived from nor encrypted
// under a broker secret: replicas sharing a PostgreSQL store then need no
// shared secret bootstrapped between them (no key file to hand every
// replica, no race creating one), each rotation is a fresh key with no
// link to earlier ones, and the store row is what a rotation replaces. A
// replica that holds the verifier but not the key (another replica issued
// it, or this one restarted) answers the first MACed call of that epoch
// with a refusal that asks for the key (api.SessionKeyWantedHeader); the
// agent makes the call again with the key (api.SessionKeyHeader), over
// the channel that carries its bearer token, and the replica keeps a key
// whose verifier matches. So the key crosses the wire once per replica
// per epoch, and checking a MAC costs what it did. Its epoch rises with
// each rotation; a call names the epoch it used, so a replica that has
// not seen a rotation another replica made reads the verifier from the
// store, and a call with an older key is refused: at once by the replica
// that rotated it, within Config.SessionKeyTTL by the others. A key is
// never logged and never in an error.

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

// issueSessionKey makes a new session key for e, stores its verifier and
// keeps the key in memory.
func (b *Broker) issueSessionKey(ctx context.Context, sk store.SessionKeys, e *agentEntry) ([]byte, uint64, error) {
	key := make([]byte, api.SessionKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, 0, fmt.Errorf("making a session key: %w", err)
	}
	now := time.Now()
	ag, _ := b.identity(e)
	ver := api.SessionKeyVerifier(key)
	epoch, err := sk.RotateSessionKey(ctx, ag.ID, ver, now)
	if err != nil {
		return nil, 0, err
	}
	b.agentsMu.Lock()
	if epoch >= e.sessEpoch {
		e.sessKey, e.sessVerifier, e.sessEpoch, e.sessLoaded = key, ver, epoch, now
	}
	b.agentsMu.Unlock()
	return key, epoch, nil
}

// sessionKey returns agent id's current session key and epoch, reading
// the verifier from the store when the caller names a newer epoch than
// this replica knows (another replica issued it) or the cached copy is
// older than SessionKeyTTL. A nil key means the agent has none. When the
// caller names the current epoch and this replica holds only its
// verifier, reveal (the key the agent sent, api.SessionKeyHeader) is
// taken if its verifier matches; without one the answer is a refusal
// that asks for it (keyWanted).
func (b *Broker) sessionKey(ctx context.Context, e *agentEntry, id string, wantEpoch uint64, reveal []byte) ([]byte, uint64, error) {
	now := time.Now()
	b.agentsMu.Lock()
	key, ver, epoch, loaded, tried := e.sessKey, e.sessVerifier, e.sessEpoch, e.sessLoaded, e.sessTried
	reload := (wantEpoch > epoch || now.Sub(loaded) > b.cfg.SessionKeyTTL) && now.Sub(tried) >= sessionReloadEvery
	if reload {
		e.sessTried = now
	}
	b.agentsMu.Unlock()
	sk := b.sessionKeys()
	if reload && sk != nil {
		// Issued by another replica, or this copy is old: the store has
		// the current verifier.
		v, ep, err := sk.SessionVerifier(ctx, id)
		switch {
		case err != nil && !errors.Is(err, store.ErrNotFound):
			// A store hiccup: the cached key (if it is the caller's)
			// still serves, and a later call reads the store again.
			b.log.Error("reading session key verifier", "agent", id, "err", err)
			if (key == nil && ver == nil) || wantEpoch != epoch {
				return nil, 0, connect.NewError(connect.CodeUnavailable, errors.New("session key store unavailable"))
			}
		default:
			if err != nil { // none: the store lost it, or never had it
				v, ep = nil, 0
			}
			b.agentsMu.Lock()
			if (ep != e.sessEpoch || !bytes.Equal(v, e.sessVerifier)) && (ep >= e.sessEpoch || ep == 0) {
				// A new key this replica has not seen: only its
				// verifier, until the agent shows the key.
				e.sessKey, e.sessVerifier, e.sessEpoch = nil, v, ep
			}
			e.sessLoaded = now
			key, ver, epoch = e.sessKey, e.sessVerifier, e.sessEpoch
			b.agentsMu.Unlock()
		}
	}
	if key != nil || ver == nil || wantEpoch != epoch {
		return key, epoch, nil
	}
	if reveal == nil {
		return nil, epoch, keyWanted(id, epoch)
	}
	if !hmac.Equal(api.SessionKeyVerifier(reveal), ver) {
		return nil, epoch, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("session key refused: the key sent for epoch %d of %s is not the one issued: enroll again for a new key", epoch, id))
	}
	b.agentsMu.Lock()
	if e.sessEpoch == epoch && e.sessKey == nil {
		e.sessKey = bytes.Clone(reveal)
	}
	b.agentsMu.Unlock()
	return reveal, epoch, nil
}

// keyWanted is the refusal of a call MACed with a key this replica holds
// only the verifier of: the agent makes it again with the key
// (api.SessionKeyWantedHeader). Unauthenticated, so that an agent that
// predates verifiers takes it as a refused key and enrolls again.
func keyWanted(id string, epoch uint64) error {
	err := connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("this broker replica holds only the verifier of session key epoch %d of %s: send the call again with the key in the %s header (gpupass-agent does this on its own)", epoch, id, api.SessionKeyHeader))
	err.Meta().Set(api.SessionKeyWantedHeader, "1")
	return err
}

// checkMAC authenticates a heartbeat by its session key HMAC; reveal is
// the session key the beat carries (nil: none, the usual case).
func (b *Broker) checkMAC(ctx context.Context, e *agentEntry, m *gpupassv1.HeartbeatRequest, reveal []byte, peer string) error {
	key, epoch, err := b.sessionKey(ctx, e, m.AgentId, m.SessionEpoch, reveal)
	if err != nil {
		if !api.SessionKeyWanted(err) {
			b.log.Warn("refused heartbeat: session key", "agent", m.AgentId, "epoch", m.SessionEpoch, "peer", peer, "err", err)
		}
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
