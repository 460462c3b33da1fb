package broker_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestAgentServiceLimit: the documented 4 MiB limit of AgentService
// messages (broker.proto) refuses a larger report upload over gRPC, the
// agent's protocol, before anything is verified or stored; a report just
// under the limit is read (and refused only for its content).
func TestAgentServiceLimit(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	a := brokertest.NewAgent(t, b.URL, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
	upload := func(size int) error {
		_, err := a.Clients.Agent.UploadReport(context.Background(), connect.NewRequest(&gpupassv1.UploadReportRequest{
			AgentId: a.ID, Report: bytes.Repeat([]byte("x"), size), Signature: "c2ln"}))
		return err
	}
	err := upload(api.MaxAgentMessageBytes + 1)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("report over %d bytes: %v, want resource_exhausted", api.MaxAgentMessageBytes, err)
	}
	err = upload(api.MaxAgentMessageBytes - 1024)
	if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "signature does not verify") {
		t.Errorf("report under the limit: %v, want it read and refused for its signature", err)
	}
	if _, err := b.Store.LatestReport(context.Background(), a.ID); err == nil {
		t.Error("a refused upload was stored")
	}
}
