package api

import (
	"crypto/ecdsa"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// HeartbeatPayload is what an agent signs for a heartbeat (broker.proto,
// HeartbeatRequest.signature): every field but the signature, in a fixed
// text form, so agent and broker sign and verify the same bytes.
func HeartbeatPayload(m *gpupassv1.HeartbeatRequest) []byte {
	return appendHeartbeat(make([]byte, 0, 96), "gpupass-heartbeat-v1\n", m, false)
}

// appendHeartbeat appends the text form of a heartbeat that HeartbeatPayload
// and HeartbeatMAC cover: a domain line (each use its own, so a signature
// is never a mac's input or the other way round), the agent id, the
// session epoch when withEpoch, the counter, the echoed broker time and the
// hold time, one per line.
func appendHeartbeat(b []byte, domain string, m *gpupassv1.HeartbeatRequest, withEpoch bool) []byte {
	b = append(b, domain...)
	b = append(b, m.GetAgentId()...)
	b = append(b, '\n')
	if withEpoch {
		b = strconv.AppendUint(b, m.GetSessionEpoch(), 10)
		b = append(b, '\n')
	}
	b = strconv.AppendUint(b, m.GetCounter(), 10)
	b = append(b, '\n')
	b = strconv.AppendInt(b, m.GetEchoBrokerTimeUnixNano(), 10)
	b = append(b, '\n')
	b = strconv.AppendInt(b, m.GetAgentHoldNanos(), 10)
	return append(b, '\n')
}

// SessionKeyBytes is the size of a heartbeat session key (256 bits).
const SessionKeyBytes = 32

// EnrollProofWindow bounds how far an enrollment proof's time may be from
// the broker's clock: an older proof is a replay.
const EnrollProofWindow = 5 * time.Minute

// EnrollProofPayload is what an agent signs to prove, at enrollment, that
// it holds the private half of the key it enrolls (broker.proto,
// EnrollRequest.proof): keyFingerprint is the hex SHA-256 of the PKIX DER
// public key.
func EnrollProofPayload(keyFingerprint string, at int64) []byte {
	b := make([]byte, 0, 112)
	b = append(b, "gpupass-enroll-v1\n"...)
	b = append(b, keyFingerprint...)
	b = append(b, '\n')
	b = strconv.AppendInt(b, at, 10)
	return append(b, '\n')
}

// HeartbeatMAC is the HMAC-SHA256 that authenticates a heartbeat with a
// session key (broker.proto, HeartbeatRequest.mac): over every field but
// the signature and the mac, session epoch included.
func HeartbeatMAC(key []byte, m *gpupassv1.HeartbeatRequest) []byte {
	var buf [128]byte
	b := appendHeartbeat(buf[:0], "gpupass-heartbeat-mac-v1\n", m, true)
	h := hmac.New(sha256.New, key)
	h.Write(b)
	return h.Sum(nil)
}

// KeyFingerprint is how the broker names an identity key: hex SHA-256 of
// its PKIX DER encoding.
func KeyFingerprint(pub *ecdsa.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("encoding public key: %w", err)
	}
	fp := sha256.Sum256(der)
	return hex.EncodeToString(fp[:]), nil
}
