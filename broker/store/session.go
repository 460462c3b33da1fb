package store

import (
	"context"
	"time"
)

// SessionKeys keeps each agent's heartbeat session key verifier: the
// broker issues a random session key at an enrollment that proves the
// agent holds its identity key, so that heartbeats and agent calls carry
// a cheap HMAC instead of an ECDSA signature, and stores only the key's
// verifier (api.SessionKeyVerifier), never the key: whoever reads the
// store (a copied SQLite file, a PostgreSQL dump) cannot make a MAC with
// it. It lives in the store so that every broker replica sharing it knows
// the current epoch and can check a key an agent shows it. The SQL
// backends implement it (a separate interface: a store without it leaves
// agents on signatures).
type SessionKeys interface {
	// RotateSessionKey replaces the agent's session key verifier with
	// verifier and returns its epoch, one more than the previous one's
	// (1 for the first).
	RotateSessionKey(ctx context.Context, agentID string, verifier []byte, at time.Time) (epoch uint64, err error)
	// SessionVerifier returns the verifier of the agent's current key
	// and its epoch, or ErrNotFound when none was issued.
	SessionVerifier(ctx context.Context, agentID string) (verifier []byte, epoch uint64, err error)
}
