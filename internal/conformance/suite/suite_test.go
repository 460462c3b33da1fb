package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/probe/nvmlprobe"
	"github.com/gpupass/gpupass/internal/spec"
)

func loadSpec(t *testing.T, name string) *spec.Result {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	res := spec.Validate(name, b)
	if !res.Valid {
		t.Fatalf("%s is not valid: %+v", name, res.Findings)
	}
	return res
}

func simulated(t *testing.T, profile string, packages []string) *Suite {
	t.Helper()
	p, err := probe.LoadProfile(profile)
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithSeed(t.Name())
	dir := t.TempDir()
	return New(p.GPUProbe(), p.NVCCProbe(), p.PythonProbe(packages),
		probe.Storage{Path: dir}, probe.ReadThroughput{Path: dir, Bytes: 1 << 20},
		probe.FIPS{Path: filepath.Join(dir, "no-fips")})
}

func statuses(r *Result) map[string]conformance.Status {
	m := map[string]conformance.Status{}
	for _, c := range r.Checks {
		m[c.Name] = c.Status
	}
	return m
}

func TestCheckNamesInOrder(t *testing.T) {
	t.Parallel()
	var got []string
	for _, c := range checks {
		got = append(got, c.name)
	}
	if diff := cmp.Diff(CheckNames, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestSimulatedAgainstSpec(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		spec    string
		profile string
		want    map[string]conformance.Status // checks not listed must pass
	}{
		{"h100.yaml", "h100-sxm5-8x", nil},
		// The A100 node runs the same software: only the class differs.
		{"h100.yaml", "a100-80gb-4x", map[string]conformance.Status{"gpu.count": conformance.Fail, "gpu.class": conformance.Fail}},
		{"h100.yaml", "rtx-4090-1x", map[string]conformance.Status{
			"driver.version": conformance.Fail, "cuda.toolkit": conformance.Fail, "python.version": conformance.Fail,
			"torch.version": conformance.Fail, "torch.abi": conformance.Fail, "gpu.count": conformance.Fail, "gpu.class": conformance.Fail,
		}},
		{"h100-other-torch.yaml", "h100-sxm5-8x", map[string]conformance.Status{"torch.version": conformance.Fail}},
	}
	for _, tt := range tests {
		t.Run(tt.spec+"/"+tt.profile, func(t *testing.T) {
			t.Parallel()
			sp := loadSpec(t, tt.spec)
			exp := FromSpec(sp.Spec)
			r, err := simulated(t, tt.profile, exp.PackageNames()).Run(ctx, exp)
			if err != nil {
				t.Fatal(err)
			}
			got := statuses(r)
			for _, name := range CheckNames {
				want := conformance.Pass
				if w, ok := tt.want[name]; ok {
					want = w
				}
				switch name {
				case "storage.mount_options", "storage.read_mbps":
					continue // the real temp dir's mount decides these
				}
				if got[name] != want {
					t.Errorf("%s = %s, want %s (%+v)", name, got[name], want, r.Checks)
				}
			}
			if r.Wall <= 0 {
				t.Error("no wall time")
			}
			fp, err := RuntimeFingerprint(&r.Facts, sp.Spec)
			if err != nil {
				t.Fatal(err)
			}
			// Equal fingerprints exactly when no runtime check failed.
			runtimeOK := got["driver.version"] == conformance.Pass && got["cuda.toolkit"] == conformance.Pass &&
				got["python.version"] == conformance.Pass && got["torch.version"] == conformance.Pass
			if (fp == sp.Fingerprint) != runtimeOK {
				t.Errorf("runtime fingerprint %s vs spec %s; runtime checks ok=%v", fp, sp.Fingerprint, runtimeOK)
			}
		})
	}
}

func TestPackageMismatchChangesFingerprint(t *testing.T) {
	t.Parallel()
	sp := loadSpec(t, "h100.yaml")
	exp := FromSpec(sp.Spec)
	r, err := simulated(t, "h100-sxm5-8x", exp.PackageNames()).Run(context.Background(), exp)
	if err != nil {
		t.Fatal(err)
	}
	r.Facts.Python.Packages["flash-attn"] = "2.5.6"
	fp, _ := RuntimeFingerprint(&r.Facts, sp.Spec)
	if fp == sp.Fingerprint {
		t.Error("a different installed flash-attn kept the fingerprint")
	}
	delete(r.Facts.Python.Packages, "flash-attn")
	r.Facts.Python.Packages["flash-attn"] = ""
	fp2, _ := RuntimeFingerprint(&r.Facts, sp.Spec)
	if fp2 == sp.Fingerprint || fp2 == fp {
		t.Error("a missing flash-attn kept a fingerprint")
	}
}

func TestNoGPU(t *testing.T) {
	t.Parallel()
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	dir := t.TempDir()
	s := New(nvmlprobe.New(lib), probe.NVCC{Path: filepath.Join(dir, "nvcc")}, probe.Storage{Path: dir}, probe.FIPS{Path: filepath.Join(dir, "fips")})
	r, err := s.Run(context.Background(), Expectations{})
	if err != nil {
		t.Fatal(err)
	}
	got := statuses(r)
	if got["gpu.count"] != conformance.Fail || got["driver.version"] != conformance.Skip || got["cuda.toolkit"] != conformance.Skip {
		t.Errorf("statuses %v", got)
	}
	for _, c := range r.Checks {
		if c.Name == "gpu.count" && c.Message != "no GPUs: NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)" {
			t.Errorf("gpu.count message %q", c.Message)
		}
	}
	if r.Passed() {
		t.Error("a node without GPUs passed")
	}
	rep, err := r.Report(ReportInput{AgentID: "agt-1", Node: conformance.Node{Region: "us-west-2"}, Now: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Simulated || len(rep.GPUs) != 0 || len(rep.Notes) == 0 || rep.Notes[0] != "NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)" {
		t.Errorf("report %+v", rep)
	}
}

// TestDegradedH100 runs the checks over go-nvml's DGX H100 mock with the
// faults a real node shows: a downtrained PCIe link, a link down, a
// foreign process holding memory.
func TestDegradedH100(t *testing.T) {
	t.Parallel()
	s := dgxh100.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.MemoryInfo.Free = dev.MemoryInfo.Total
		if i == 1 {
			dev.MemoryInfo.Free = dev.MemoryInfo.Total / 2
		}
		dev.GetSerialFunc = func() (string, nvml.Return) { return fmt.Sprint(i), nvml.SUCCESS }
		dev.GetVbiosVersionFunc = func() (string, nvml.Return) { return "96.00.74.00.0E", nvml.SUCCESS }
		dev.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { return 5, nvml.SUCCESS }
		dev.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) {
			if i == 2 {
				return 8, nvml.SUCCESS
			}
			return 16, nvml.SUCCESS
		}
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if i == 6 && l == 0 {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if i == 1 {
				return []nvml.ProcessInfo{{Pid: 777, UsedGpuMemory: dev.MemoryInfo.Total / 2}}, nvml.SUCCESS
			}
			return nil, nvml.SUCCESS
		}
	}
	dir := t.TempDir()
	r, err := New(nvmlprobe.New(s), probe.Storage{Path: dir}).Run(context.Background(), Expectations{Accelerator: "h100-sxm5", Count: 8})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]conformance.Check{
		"pcie.link":             {Name: "pcie.link", Expected: "Gen5 x16 on every GPU", Actual: "Gen5 x16 on 7, Gen5 x8 on 1", Status: conformance.Fail, Message: "degraded link: GPU 2 at Gen5 x8"},
		"nvlink.state":          {Name: "nvlink.state", Expected: "144/144 links active", Actual: "143/144 links active", Status: conformance.Fail, Message: "links down: GPU 6: 17/18"},
		"gpu.foreign_processes": {Name: "gpu.foreign_processes", Expected: "0", Actual: "1", Status: conformance.Fail, Message: "GPU 1: pid 777 (40960 MiB)"},
		"gpu.memory.free":       {Name: "gpu.memory.free", Expected: ">= 95% free on every GPU", Actual: "50.0% free (lowest: GPU 1)", Status: conformance.Fail},
		"gpu.class":             {Name: "gpu.class", Expected: "h100-sxm5", Actual: "h100-sxm5", Status: conformance.Pass},
		"gpu.count":             {Name: "gpu.count", Expected: ">= 8", Actual: "8", Status: conformance.Pass},
	}
	own, err := New(nvmlprobe.New(s)).Run(context.Background(), Expectations{OwnPIDs: map[uint32]bool{777: true}})
	if err != nil {
		t.Fatal(err)
	}
	if st := statuses(own)["gpu.foreign_processes"]; st != conformance.Pass {
		t.Errorf("the agent's own job counted as foreign: %s", st)
	}
	for _, c := range r.Checks {
		w, ok := want[c.Name]
		if !ok {
			continue
		}
		c.DurationMS = 0
		if diff := cmp.Diff(w, c); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.Name, diff)
		}
	}
}

// TestCaching: nvcc is measured once while its binary is unchanged and
// again after it is replaced; live probes are always measured.
func TestCaching(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	nvcc := filepath.Join(dir, "nvcc")
	write := func(v string) {
		body := fmt.Sprintf("#!/bin/sh\necho 'Cuda compilation tools, release %s, V%s'\n", v[:4], v)
		if err := os.WriteFile(nvcc+".tmp", []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(nvcc+".tmp", nvcc); err != nil {
			t.Fatal(err)
		}
	}
	write("12.1.105")
	s := New(probe.NVCC{Path: nvcc}, probe.Storage{Path: dir})
	ctx := context.Background()
	actual := func(r *Result, name string) conformance.Check {
		for _, c := range r.Checks {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no check %s", name)
		return conformance.Check{}
	}
	r1, err := s.Run(ctx, Expectations{CUDA: "12.1.105"})
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := s.Run(ctx, Expectations{CUDA: "12.1.105"})
	if c := actual(r1, "cuda.toolkit"); c.Cached || c.Status != conformance.Pass {
		t.Errorf("first run: %+v", c)
	}
	if c := actual(r2, "cuda.toolkit"); !c.Cached || c.Status != conformance.Pass {
		t.Errorf("second run not cached: %+v", c)
	}
	if c := actual(r2, "storage.free"); c.Cached {
		t.Errorf("live check cached: %+v", c)
	}
	if diff := cmp.Diff([]string{"nvcc"}, r2.Reused); diff != "" {
		t.Errorf("Reused (-want +got):\n%s", diff)
	}
	write("12.4.131")
	r3, _ := s.Run(ctx, Expectations{CUDA: "12.1.105"})
	if c := actual(r3, "cuda.toolkit"); c.Cached || c.Actual != "12.4.131" || c.Status != conformance.Fail {
		t.Errorf("after replacing nvcc: %+v", c)
	}
	s.Invalidate()
	r4, _ := s.Run(ctx, Expectations{})
	if len(r4.Reused) != 0 {
		t.Errorf("reused %v after Invalidate", r4.Reused)
	}
}

func TestReportSignsAndRoundTrips(t *testing.T) {
	t.Parallel()
	r, err := simulated(t, "h100-sxm5-8x", nil).Run(context.Background(), Expectations{StorageClass: "standard"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Report(ReportInput{AgentID: "agt-x", Node: conformance.Node{Region: "eu-central-1", Provider: "sim"}, StorageClass: "standard", Now: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Simulated || rep.Profile != "h100-sxm5-8x" || len(rep.GPUs) != 8 || rep.GeneratedAt != "2026-01-02T03:04:05.006Z" || len(rep.Checks) != len(CheckNames) {
		t.Errorf("report %+v", rep)
	}
	b, err := rep.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := conformance.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := back.Marshal()
	if string(b) != string(b2) {
		t.Error("report bytes change after a round trip")
	}
}
