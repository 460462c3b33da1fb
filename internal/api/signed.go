package api

import (
	"strconv"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// HeartbeatPayload is what an agent signs for a heartbeat (broker.proto,
// HeartbeatRequest.signature): every field but the signature, in a fixed
// text form, so agent and broker sign and verify the same bytes.
func HeartbeatPayload(m *gpupassv1.HeartbeatRequest) []byte {
	b := make([]byte, 0, 96)
	b = append(b, "gpupass-heartbeat-v1\n"...)
	b = append(b, m.GetAgentId()...)
	b = append(b, '\n')
	b = strconv.AppendUint(b, m.GetCounter(), 10)
	b = append(b, '\n')
	b = strconv.AppendInt(b, m.GetEchoBrokerTimeUnixNano(), 10)
	b = append(b, '\n')
	b = strconv.AppendInt(b, m.GetAgentHoldNanos(), 10)
	return append(b, '\n')
}
