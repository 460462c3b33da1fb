package suite

import (
	"sort"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
)

// MeasuredSpec returns the spec that describes the measured runtime, in
// the spec's own vocabulary, so spec.Fingerprint can hash it exactly as it
// hashes a declared spec. What a node cannot measure is taken from like
// (when given): cuda-malloc-async and its threshold are job settings, and
// no-internet-access is a policy; the packages are those like declares,
// at the versions installed here. Without like, the packages are those
// the probe was asked about.
func MeasuredSpec(f *probe.Facts, like *spec.Spec) *spec.Spec {
	s := &spec.Spec{Runtime: spec.Runtime{
		CUDA:         f.NVCC.Version,
		NvidiaDriver: f.GPU.DriverVersion,
		Python:       f.Python.Version,
		PyTorch:      f.Python.Torch,
		Packages:     []string{},
	}, Security: spec.Security{FIPSCompliant: f.FIPS.Enabled}}
	names := make([]string, 0, len(f.Python.Packages))
	if like != nil {
		s.Runtime.CUDAMallocAsync = like.Runtime.CUDAMallocAsync
		s.Runtime.CUDAMallocAsyncReleaseThreshold = like.Runtime.CUDAMallocAsyncReleaseThreshold
		s.Security.NoInternetAccess = like.Security.NoInternetAccess
		for n := range PinnedPackages(like) {
			names = append(names, n)
		}
	} else {
		for n := range f.Python.Packages {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		v := f.Python.Packages[n]
		if v == "" {
			// Not installed: name it unpinned, so the fingerprint differs
			// from any spec that pins it.
			s.Runtime.Packages = append(s.Runtime.Packages, n)
			continue
		}
		s.Runtime.Packages = append(s.Runtime.Packages, n+"=="+v)
	}
	return s
}

// MeasuredRuntime is the runtime the probe found, as the report, the
// broker's index and validate --local give it: the one place facts become
// a conformance.Runtime. Packages are those installed (not-installed
// names the probe was asked about are left out).
func MeasuredRuntime(f *probe.Facts) conformance.Runtime {
	return conformance.Runtime{
		NvidiaDriver: f.GPU.DriverVersion, CUDADriverAPI: f.GPU.CUDADriverAPI, CUDA: f.NVCC.Version,
		Python: f.Python.Version, PyTorch: f.Python.Torch, TorchCUDA: f.Python.TorchCUDA,
		CuDNN: f.Python.CuDNN, Packages: installed(f.Python.Packages), FIPSEnabled: f.FIPS.Enabled,
	}
}

// RuntimeFingerprint is spec.Fingerprint of MeasuredSpec(f, like): equal
// to a spec's fingerprint exactly when this node measures what it declares.
func RuntimeFingerprint(f *probe.Facts, like *spec.Spec) (string, error) {
	return spec.Fingerprint(MeasuredSpec(f, like))
}

// ReportInput is what the agent adds to a suite result to make a report.
type ReportInput struct {
	AgentID      string
	Node         conformance.Node
	StorageClass string
	Now          time.Time
	// AllocID and Spec make a run's own report: bound to the allocation,
	// with the runtime fingerprint taken against the run's spec (its
	// packages as installed, its job settings), so it equals the spec's
	// fingerprint exactly when the node runs what the spec declares.
	AllocID string
	Spec    *spec.Spec
}

// Report builds the conformance report of a result. Without in.Spec the
// runtime fingerprint covers no packages (the agent's periodic suite asks
// about none; runs check packages at start) and has cuda-malloc-async and
// no-internet-access false; with it, see ReportInput.
func (r *Result) Report(in ReportInput) (*conformance.Report, error) {
	f := &r.Facts
	fp, err := RuntimeFingerprint(f, in.Spec)
	if err != nil {
		return nil, err
	}
	specFP := ""
	if in.Spec != nil {
		if specFP, err = spec.Fingerprint(in.Spec); err != nil {
			return nil, err
		}
	}
	rep := &conformance.Report{
		SchemaVersion:      conformance.SchemaVersion,
		AgentID:            in.AgentID,
		GeneratedAt:        in.Now.UTC().Format("2006-01-02T15:04:05.000Z"),
		Simulated:          f.Simulated(),
		Profile:            f.GPU.Profile,
		AllocationID:       in.AllocID,
		SpecFingerprint:    specFP,
		Node:               in.Node,
		Runtime:            MeasuredRuntime(f),
		RuntimeFingerprint: fp,
		GPUs:               []conformance.GPU{},
		Storage: conformance.Storage{
			Path: f.Storage.Path, FSType: f.Storage.FSType, MountOptions: f.Storage.MountOptions,
			FreeGB: round(float64(f.Storage.FreeBytes)/1e9, 2), ReadMBps: round(f.Storage.ReadMBps, 1),
			Class: in.StorageClass,
		},
		Checks:          r.Checks,
		SuiteDurationMS: round(float64(r.Wall.Microseconds())/1000, 3),
	}
	for _, g := range f.GPU.GPUs {
		cg := conformance.GPU{
			Index: g.Index, Name: g.Name, Class: f.GPU.Class, UUID: g.UUID, Serial: g.Serial, VBIOS: g.VBIOS,
			MemoryTotalMiB: g.MemoryTotalMiB, MemoryFreeMiB: g.MemoryFreeMiB,
			PCIeGen: g.PCIeGen, PCIeWidth: g.PCIeWidth, NVLinkActive: g.NVLinkActive,
		}
		for _, p := range g.Processes {
			cg.ForeignProcesses = append(cg.ForeignProcesses, conformance.Process{PID: p.PID, UsedMemoryMiB: p.UsedMemoryMiB})
		}
		rep.GPUs = append(rep.GPUs, cg)
	}
	notes := []struct{ what, reason string }{
		{"", f.GPU.Reason}, // already says "NVML not available: …"
		{"nvcc: ", f.NVCC.Reason}, {"python: ", f.Python.Reason}, {"torch: ", f.Python.TorchReason},
		{"storage: ", f.Storage.Reason}, {"fips: ", f.FIPS.Reason},
	}
	for _, n := range notes {
		if n.reason != "" {
			rep.Notes = append(rep.Notes, n.what+n.reason)
		}
	}
	if rep.Simulated {
		rep.Notes = append(rep.Notes, "simulated hardware profile "+f.GPU.Profile+": GPU values are not measurements")
	}
	return rep, nil
}

func installed(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if v != "" {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// round keeps reports short and their canonical bytes free of float
// noise; canonjson writes what encoding/json writes.
func round(v float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	return float64(int64(v*p+0.5)) / p
}
