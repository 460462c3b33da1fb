package api_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"testing"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// The signed and maced bytes are a wire format between agent and broker
// versions (broker.proto documents them): pinned here, byte for byte.
func TestHeartbeatBytes(t *testing.T) {
	m := &gpupassv1.HeartbeatRequest{AgentId: "agt-1", SessionEpoch: 7, Counter: 42, EchoBrokerTimeUnixNano: -5, AgentHoldNanos: 1500}
	if got, want := string(api.HeartbeatPayload(m)), "gpupass-heartbeat-v1\nagt-1\n42\n-5\n1500\n"; got != want {
		t.Errorf("HeartbeatPayload = %q, want %q", got, want)
	}
	h := hmac.New(sha256.New, []byte("k"))
	h.Write([]byte("gpupass-heartbeat-mac-v1\nagt-1\n7\n42\n-5\n1500\n"))
	if got := api.HeartbeatMAC([]byte("k"), m); !hmac.Equal(got, h.Sum(nil)) {
		t.Errorf("HeartbeatMAC is not the HMAC of the documented text")
	}
}
