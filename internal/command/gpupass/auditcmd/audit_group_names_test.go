package auditcmd

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// Two runs of a group in one region get the allocation id in their zip's
// name, so that neither overwrites the other.
func TestGroupZipNames(t *testing.T) {
	t.Parallel()
	runs := []*gpupassv1.Run{{Id: "alloc-1", Region: "us-west-2"}, {Id: "alloc-2", Region: "ap-south-1"}, {Id: "alloc-3", Region: "us-west-2"}}
	want := []string{"audit-us-west-2-alloc-1.zip", "audit-ap-south-1.zip", "audit-us-west-2-alloc-3.zip"}
	got, err := groupZipNames(runs)
	if diff := cmp.Diff(want, got); err != nil || diff != "" {
		t.Errorf("zip names (-want +got), %v:\n%s", err, diff)
	}
	// Names from the broker never become a path outside --out.
	for _, bad := range []*gpupassv1.Run{{Id: "alloc-1", Region: "../x"}, {Id: "../../x", Region: "us-west-2"}, {Id: "alloc-1/..", Region: "us-west-2"}} {
		if _, err := groupZipNames([]*gpupassv1.Run{bad, {Id: "alloc-2", Region: "us-west-2"}}); err == nil {
			t.Errorf("run %+v named a zip", bad)
		}
	}
	// --out left at its default (the CI inputs' too) names audit-GROUP.
	if g := GroupOut("group-00000000000000ff", "audit-report.zip"); g != "audit-group-00000000000000ff" {
		t.Errorf("default --out for a group = %q, want audit-group-00000000000000ff", g)
	}
}
