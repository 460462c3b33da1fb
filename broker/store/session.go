package store

import (
	"context"
	"time"
)

// SessionKeys keeps each agent's heartbeat session key: a random secret
// the broker issues at an enrollment that proves the agent holds its
// identity key, so that heartbeats carry a cheap HMAC instead of an ECDSA
// signature. It lives in the store so that every broker replica sharing
// it accepts a key issued by any of them. The SQL backends implement it
// (a separate interface: a store without it leaves agents on signatures).
type SessionKeys interface {
	// RotateSessionKey replaces the agent's session key with key and
	// returns its epoch, one more than the previous key's (1 for the
	// first).
	RotateSessionKey(ctx context.Context, agentID string, key []byte, at time.Time) (epoch uint64, err error)
	// SessionKey returns the agent's current key and its epoch, or
	// ErrNotFound when none was issued.
	SessionKey(ctx context.Context, agentID string) (key []byte, epoch uint64, err error)
}
