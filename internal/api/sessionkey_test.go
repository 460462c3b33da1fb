package api

import (
	"bytes"
	"strings"
	"testing"
)

// TestSessionKeyHeader: a key round-trips through the header; anything
// else is refused with an error that names the header and never quotes
// the value (it may be a secret); the verifier is not the key.
func TestSessionKeyHeader(t *testing.T) {
	t.Parallel()
	key := bytes.Repeat([]byte{0xab}, SessionKeyBytes)
	got, err := ParseSessionKeyHeader(EncodeSessionKey(key))
	if err != nil || !bytes.Equal(got, key) {
		t.Fatalf("round trip: %x, %v", got, err)
	}
	if k, err := ParseSessionKeyHeader(""); k != nil || err != nil {
		t.Errorf("no header: %x, %v; want nil, nil", k, err)
	}
	for _, v := range []string{EncodeSessionKey(key[:16]), "not base64 !!", EncodeSessionKey(key) + "AAAA", "+" + EncodeSessionKey(key)[1:]} {
		_, err := ParseSessionKeyHeader(v)
		if err == nil || !strings.Contains(err.Error(), SessionKeyHeader) || strings.Contains(err.Error(), v) {
			t.Errorf("ParseSessionKeyHeader(%q) = %v; want an error naming %s without the value", v, err, SessionKeyHeader)
		}
	}
	if v := SessionKeyVerifier(key); len(v) != 32 || bytes.Equal(v, key) || bytes.Equal(v, SessionKeyVerifier(key[:31])) {
		t.Errorf("verifier %x", v)
	}
}
