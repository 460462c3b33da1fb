//go:build cgo

package nvmlprobe

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/probe"
)

// fillH100 completes go-nvml's DGX H100 mock with what a real SXM5 board
// answers and the mock leaves unset: serial, VBIOS, PCIe link, 18 NVLink
// links, free memory and, on GPU 3, a foreign process.
func fillH100(s *server.Server) {
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.MemoryInfo.Free = dev.MemoryInfo.Total - 512*mib
		dev.GetSerialFunc = func() (string, nvml.Return) { return fmt.Sprintf("165282301%04d", i), nvml.SUCCESS }
		dev.GetVbiosVersionFunc = func() (string, nvml.Return) { return "96.00.74.00.0E", nvml.SUCCESS }
		dev.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { return 5, nvml.SUCCESS }
		dev.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) { return 16, nvml.SUCCESS }
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if i == 5 && l == 7 {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if i == 3 {
				return []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 2048 * mib}}, nvml.SUCCESS
			}
			return nil, nvml.SUCCESS
		}
	}
}

func TestMeasureDGXH100(t *testing.T) {
	t.Parallel()
	s := dgxh100.New()
	fillH100(s)
	sec, err := New(s).Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := sec.(probe.GPUSection)
	if !got.Available || got.Reason != "" {
		t.Fatalf("Available=%v Reason=%q, want available", got.Available, got.Reason)
	}
	if got.DriverVersion != "550.54.15" || got.CUDADriverAPI != "12.4" || got.Class != "h100-sxm5" {
		t.Errorf("driver %q cuda %q class %q, want 550.54.15 12.4 h100-sxm5", got.DriverVersion, got.CUDADriverAPI, got.Class)
	}
	if len(got.GPUs) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(got.GPUs))
	}
	for i, g := range got.GPUs {
		uuid := s.Devices[i].(*server.Device).UUID
		want := probe.GPU{
			Index: i, Name: "NVIDIA H100 80GB HBM3", UUID: uuid,
			Serial: fmt.Sprintf("165282301%04d", i), VBIOS: "96.00.74.00.0E",
			MemoryTotalMiB: 81920, MemoryFreeMiB: 81920 - 512,
			PCIeGen: 5, PCIeWidth: 16, NVLinkActive: 18, NVLinkLinks: 18,
		}
		if i == 5 {
			want.NVLinkActive = 17
		}
		if i == 3 {
			want.Processes = []probe.Process{{PID: 4242, UsedMemoryMiB: 2048}}
		}
		if diff := cmp.Diff(want, g); diff != "" {
			t.Errorf("GPU %d (-want +got):\n%s", i, diff)
		}
	}
}

// The DGX H200 mock as shipped leaves serial, VBIOS, PCIe, NVLink and
// processes unset (calling them panics inside the mock). The probe must
// give a partial answer naming each missing field, not crash.
func TestMeasureDGXH200Partial(t *testing.T) {
	t.Parallel()
	sec, err := New(dgxh200.New()).Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := sec.(probe.GPUSection)
	if !got.Available || len(got.GPUs) != 8 || got.Class != "h200" {
		t.Fatalf("Available=%v GPUs=%d class=%q, want true 8 h200", got.Available, len(got.GPUs), got.Class)
	}
	g := got.GPUs[0]
	if g.Name != "NVIDIA H200 141GB HBM3e" || g.MemoryTotalMiB != 144384 {
		t.Errorf("GPU 0 = %q %d MiB", g.Name, g.MemoryTotalMiB)
	}
	for _, f := range []string{"serial", "vbios", "pcie_gen", "pcie_width", "nvlink", "processes"} {
		found := false
		for _, e := range g.Errors {
			found = found || strings.HasPrefix(e, f+":")
		}
		if !found {
			t.Errorf("Errors %q lack %s", g.Errors, f)
		}
	}
}

func TestNotAvailable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ret  nvml.Return
		want string
	}{
		{"library missing", nvml.ERROR_LIBRARY_NOT_FOUND, "NVML not available: libnvidia-ml.so.1 not found"},
		{"driver not loaded", nvml.ERROR_DRIVER_NOT_LOADED, "NVML not available: the NVIDIA kernel driver is not loaded"},
		{"no permission", nvml.ERROR_NO_PERMISSION, "NVML not available: no permission"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lib := &mock.Interface{InitFunc: func() nvml.Return { return tt.ret }}
			sec, err := New(lib).Measure(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			got := sec.(probe.GPUSection)
			if got.Available || !strings.HasPrefix(got.Reason, tt.want) || len(got.GPUs) != 0 {
				t.Errorf("got Available=%v Reason=%q GPUs=%d, want unavailable %q", got.Available, got.Reason, len(got.GPUs), tt.want)
			}
		})
	}
}

// TestRealLibrary runs the real binding: on a machine without the NVIDIA
// driver it must say so plainly; on a GPU node it must find GPUs.
func TestRealLibrary(t *testing.T) {
	t.Parallel()
	sec, err := Default().Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := sec.(probe.GPUSection)
	if got.Available {
		if len(got.GPUs) == 0 {
			t.Errorf("NVML available but no GPUs: %+v", got)
		}
		return
	}
	if !strings.HasPrefix(got.Reason, "NVML not available: ") {
		t.Errorf("Reason = %q, want NVML not available: …", got.Reason)
	}
}

func TestCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New(dgxh100.New()).Measure(ctx); err == nil {
		t.Error("Measure on a cancelled context returned no error")
	}
}
