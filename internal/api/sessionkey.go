package api

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	"connectrpc.com/connect"
)

// Session keys at rest. The broker's store keeps no session key, only its
// verifier (SessionKeyVerifier), so that a copy of the database (a SQLite
// file read by another local user, a PostgreSQL dump, a backup) is not
// enough to make a heartbeat or an agent call as the node: a MAC needs the
// key, and the verifier is a one-way hash of 256 random bits. The replica
// that issued a key keeps it in memory and checks MACs at once. A replica
// that holds only the verifier (another replica issued the key, or it
// restarted since) answers the first MACed call of that epoch with a
// refusal marked SessionKeyWantedHeader; the agent then sends the same
// call once more with the key itself in SessionKeyHeader, over the
// channel that carries its bearer token. The replica checks the key
// against the verifier, keeps it in memory and checks the MAC as usual;
// later calls carry only MACs. So the key crosses the wire once per
// replica per epoch, not on every call.
const (
	// SessionKeyHeader carries the session key the call's MAC was made
	// with (unpadded base64url), sent only when the broker asked for it.
	SessionKeyHeader = "Gpupass-Session-Key"
	// SessionKeyWantedHeader marks a refusal by a replica that holds the
	// verifier of the call's session key epoch but not the key: the same
	// call with SessionKeyHeader set goes through.
	SessionKeyWantedHeader = "Gpupass-Session-Key-Wanted"
)

// SessionKeyVerifier is what the broker stores for a session key: the
// SHA-256 of a domain line and the key, never an input of a MAC (the MACs
// are keyed with the key itself).
func SessionKeyVerifier(key []byte) []byte {
	h := sha256.New()
	h.Write([]byte("gpupass-session-key-verifier-v1\n"))
	h.Write(key)
	return h.Sum(nil)
}

// EncodeSessionKey is a session key as SessionKeyHeader carries it.
func EncodeSessionKey(key []byte) string { return base64.RawURLEncoding.EncodeToString(key) }

// ParseSessionKeyHeader reads a SessionKeyHeader value; "" is no key (nil).
func ParseSessionKeyHeader(v string) ([]byte, error) {
	if v == "" {
		return nil, nil
	}
	if len(v) > base64.RawURLEncoding.EncodedLen(SessionKeyBytes) {
		return nil, fmt.Errorf("%s header is %d bytes, more than a %d-byte key takes", SessionKeyHeader, len(v), SessionKeyBytes)
	}
	k, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(k) != SessionKeyBytes {
		// The value is a secret: never quoted.
		return nil, fmt.Errorf("%s header is not a %d-byte key in unpadded base64url", SessionKeyHeader, SessionKeyBytes)
	}
	return k, nil
}

// SessionKeyWanted reports whether err is a refusal that asks for the
// call again with the session key (SessionKeyWantedHeader).
func SessionKeyWanted(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Meta().Get(SessionKeyWantedHeader) != ""
}
