package nodeview_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/nodeview"
)

// TestEdges holds what the golden files on the built CLI cannot reach
// with a live broker: a node never measured or seen (null, not -1 or 0),
// one with no report (runtime null, failed_checks []), an out-of-scope
// node told by region alone, and an answer with nothing in it ([] lists).
func TestEdges(t *testing.T) {
	t.Parallel()
	enc := func(v any) string {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	tests := []struct {
		name string
		got  any
		want string
	}{
		{"unmeasured node", nodeview.NodeOf(&gpupassv1.Node{Id: "n1", Region: "us", RttMs: -1}),
			`{"id":"n1","provider":"","region":"us","zone":"","hostname":"","accelerator":"","gpu_name":"","gpu_count":0,"gpu_memory_mib":0,` +
				`"storage_class":"","storage_free_gb":0,"storage_read_mbps":0,"bandwidth_gbps":0,"price_per_hour":0,"runtime":null,"runtime_fingerprint":"",` +
				`"simulated":false,"profile":"","online":false,"last_seen_at":null,"rtt_ms":null,"conformance_passed":false,"failed_checks":[],` +
				`"report_generated_at":null,"health":null,"admission":""}`},
		{"measured zero", nodeview.BriefOf(&gpupassv1.Node{Id: "n2", RttMs: 0, LastSeenUnixNano: 1}, false),
			`{"id":"n2","provider":"","region":"","accelerator":"","gpu_count":0,"price_per_hour":0,"online":false,` +
				`"last_seen_at":"1970-01-01T00:00:00.000000001Z","rtt_ms":0,"simulated":false,"conformance_passed":false,"health":null,"out_of_scope":false}`},
		{"out of scope", nodeview.DryRunOf(&gpupassv1.DryRunResponse{
			Excluded: []*gpupassv1.Excluded{{Node: &gpupassv1.Node{Id: "n3", Region: "ap-south-1", RttMs: -1},
				Reasons: []*gpupassv1.Reason{{Code: "region_scope", Field: "region", Expected: "us-*", Measured: "ap-south-1"}}}},
			ExcludedTotal: 1}).Excluded,
			`[{"node":{"id":"n3","region":"ap-south-1","out_of_scope":true},"reasons":[{"code":"region_scope","field":"region","expected":"us-*","measured":"ap-south-1","message":""}]}]`},
		{"empty answer", nodeview.DryRunOf(&gpupassv1.DryRunResponse{}),
			`{"spec_fingerprint":"","min_health_score":0,"candidates_total":0,"excluded_total":0,"candidates":[],"excluded":[],"reason_counts":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, enc(tt.got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
