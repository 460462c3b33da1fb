package gpupass

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
)

// validate --local compares declared and measured versions as the broker
// matches them (conformance.DeclaredVersions): a version written with
// spaces (spec_json, a quoted YAML string) is the broker's match, and was
// a local mismatch.
func TestLocalComparesAsTheBrokerMatches(t *testing.T) {
	t.Parallel()
	f := &probe.Facts{}
	f.GPU.DriverVersion, f.NVCC.Version, f.Python.Version, f.Python.Torch = "535.104.05", "12.1.105", "3.10.12", "2.1.0+cu121"
	s := &spec.Spec{Runtime: spec.Runtime{NvidiaDriver: "535.104.05", CUDA: " 12.1.105 ", Python: "3.10.12", PyTorch: "2.1.0+cu122"}}
	lr, err := compareLocal(f, s, "/usr/bin/python3")
	if err != nil {
		t.Fatal(err)
	}
	want := []LocalMismatch{{Field: "runtime.pytorch", What: "PyTorch version", Expected: "2.1.0+cu122", Got: "2.1.0+cu121"}}
	if diff := cmp.Diff(want, lr.Mismatches); diff != "" {
		t.Errorf("mismatches (-want +got):\n%s", diff)
	}
}
