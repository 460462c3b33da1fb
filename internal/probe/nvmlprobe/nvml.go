//go:build cgo

// Package nvmlprobe reads GPUs through NVML (github.com/NVIDIA/go-nvml).
// It is the only cgo part of the probes; without cgo it reports NVML as
// not available. It never crashes when the library is absent: the section
// says "NVML not available: <reason>".
package nvmlprobe

import (
	"context"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpupass/gpupass/internal/probe"
)

// Probe reads GPUs through an nvml.Interface.
type Probe struct {
	lib nvml.Interface
}

// New returns a probe over lib: nvml.New() on a real node, a
// pkg/nvml/mock server in tests.
func New(lib nvml.Interface) *Probe { return &Probe{lib: lib} }

// Default returns a probe over the system's libnvidia-ml.
func Default() probe.Probe { return New(nvml.New()) }

// Name implements probe.Probe.
func (p *Probe) Name() string { return "gpu" }

// Measure implements probe.Probe.
func (p *Probe) Measure(ctx context.Context) (probe.Section, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return p.measure(), nil
}

func (p *Probe) measure() (s probe.GPUSection) {
	defer func() {
		// A binding that lacks a symbol (old driver, partial mock) must
		// not take the agent down: report what failed instead.
		if r := recover(); r != nil {
			s = probe.GPUSection{Reason: fmt.Sprintf("NVML not available: %v", r)}
		}
	}()
	if ret := p.lib.Init(); ret != nvml.SUCCESS {
		return probe.GPUSection{Reason: "NVML not available: " + describe(ret)}
	}
	defer p.lib.Shutdown()

	s.Available = true
	if v, ret := p.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		s.DriverVersion = v
	}
	if v, ret := p.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		// cuDriverGetVersion encodes 12.4 as 12040.
		s.CUDADriverAPI = fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
	}
	n, ret := p.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		s.Reason = "NVML device count: " + describe(ret)
		return s
	}
	for i := 0; i < n; i++ {
		d, ret := p.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			s.GPUs = append(s.GPUs, probe.GPU{Index: i, Errors: []string{"handle: " + describe(ret)}})
			continue
		}
		s.GPUs = append(s.GPUs, device(i, d))
	}
	if len(s.GPUs) > 0 {
		s.Class = probe.ClassOf(s.GPUs[0].Name, s.GPUs[0].MemoryTotalMiB)
	}
	return s
}

const mib = 1024 * 1024

func device(i int, d nvml.Device) probe.GPU {
	g := probe.GPU{Index: i}
	field := func(name string, f func() nvml.Return) {
		defer func() {
			if r := recover(); r != nil {
				g.Errors = append(g.Errors, name+": not supported by this NVML")
			}
		}()
		if ret := f(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			g.Errors = append(g.Errors, name+": "+describe(ret))
		}
	}
	var ret nvml.Return
	field("name", func() nvml.Return { g.Name, ret = d.GetName(); return ret })
	field("uuid", func() nvml.Return { g.UUID, ret = d.GetUUID(); return ret })
	field("serial", func() nvml.Return { g.Serial, ret = d.GetSerial(); return ret })
	field("vbios", func() nvml.Return { g.VBIOS, ret = d.GetVbiosVersion(); return ret })
	field("memory", func() nvml.Return {
		m, r := d.GetMemoryInfo()
		g.MemoryTotalMiB, g.MemoryFreeMiB = m.Total/mib, m.Free/mib
		return r
	})
	field("pcie_gen", func() nvml.Return { g.PCIeGen, ret = d.GetCurrPcieLinkGeneration(); return ret })
	field("pcie_width", func() nvml.Return { g.PCIeWidth, ret = d.GetCurrPcieLinkWidth(); return ret })
	field("nvlink", func() nvml.Return {
		for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
			st, r := d.GetNvLinkState(l)
			if r != nvml.SUCCESS {
				// Links are numbered densely: the first one that does
				// not answer ends the list (NOT_SUPPORTED on PCIe cards).
				if l == 0 && r != nvml.ERROR_NOT_SUPPORTED && r != nvml.ERROR_INVALID_ARGUMENT {
					return r
				}
				break
			}
			g.NVLinkLinks++
			if st == nvml.FEATURE_ENABLED {
				g.NVLinkActive++
			}
		}
		return nvml.SUCCESS
	})
	field("processes", func() nvml.Return {
		ps, r := d.GetComputeRunningProcesses()
		for _, p := range ps {
			g.Processes = append(g.Processes, probe.Process{PID: p.Pid, UsedMemoryMiB: p.UsedGpuMemory / mib})
		}
		return r
	})
	return g
}

func describe(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to talk to the NVIDIA driver"
	}
	s := strings.TrimSpace(ret.Error())
	if s == "" {
		s = fmt.Sprintf("NVML error %d", int(ret))
	}
	return s
}

// Describe says in words why an NVML call failed (agentmetrics reports
// NVML's absence in the same words as the probe).
func Describe(ret nvml.Return) string { return describe(ret) }
