package conformance

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestRuntimeProto keeps proto.go the one complete conversion of the
// measured runtime: a field added to Runtime or to the API's message and
// not converted fails it. Packages are the one field left off the wire
// on purpose (Fill says why).
func TestRuntimeProto(t *testing.T) {
	t.Parallel()
	var r Runtime
	testutil.FillFields(t, &r)
	m := r.ToProto()
	testutil.AllProtoFieldsSet(t, m)
	want := r
	want.Packages = nil
	if diff := cmp.Diff(&want, RuntimeFromProto(m)); diff != "" {
		t.Errorf("RuntimeFromProto(ToProto(r)) (-want +got):\n%s", diff)
	}
	if RuntimeFromProto(nil) != nil {
		t.Error("RuntimeFromProto(nil) is not nil")
	}
}
