package broker_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/gpupass/gpupass/broker/brokertest"
)

// TestReflection drives the broker's gRPC server reflection with grpc-go's
// own reflection client (what grpcurl uses), over h2c on loopback: the
// services are listed and their descriptors resolve without .proto files.
func TestReflection(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	conn, err := grpc.NewClient(strings.TrimPrefix(b.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatalf("sending reflection request: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reading reflection response: %v", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection error: %s", e.ErrorMessage)
		}
		return resp
	}

	resp := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	want := []string{"gpupass.v1.AgentService", "gpupass.v1.AgentWorkService", "gpupass.v1.NodeService", "gpupass.v1.RunService"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("listed services (-want +got):\n%s", diff)
	}

	resp = ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "gpupass.v1.NodeService"}})
	var methods []string
	for _, raw := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
		var fd descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(raw, &fd); err != nil {
			t.Fatal(err)
		}
		for _, s := range fd.GetService() {
			if s.GetName() == "NodeService" {
				for _, m := range s.GetMethod() {
					methods = append(methods, m.GetName()+"("+m.GetInputType()+")")
				}
			}
		}
	}
	if !slices.Contains(methods, "DryRun(.gpupass.v1.DryRunRequest)") {
		t.Errorf("NodeService methods by reflection = %v, want DryRun(.gpupass.v1.DryRunRequest)", methods)
	}

	// An unknown symbol is an error answer on the same stream, not a hang.
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "gpupass.v1.NoSuchService"}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || resp.GetErrorResponse() == nil {
		t.Errorf("unknown symbol: got %v, %v; want an error response", resp, err)
	}
}
