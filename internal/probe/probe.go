// Package probe measures the node a job would run on: GPUs (through a
// GPUSource such as NVML or a simulated profile), the CUDA toolkit (nvcc),
// the configured Python runtime (torch, cuDNN, packages), the storage of a
// work path and FIPS mode.
//
// Every probe sits behind the same small Probe interface so the
// conformance suite can run, time and cache them uniformly. The package is
// pure Go: the cgo NVML binding lives in the nvmlprobe subpackage, so that
// importers which only read Facts need no C toolchain. Absent tools are not
// errors: a section says Found=false and why ("not found"); errors are kept
// for a cancelled context.
package probe

import (
	"context"
	"strings"
)

// Probe measures one part of the node.
type Probe interface {
	// Name identifies the probe: gpu, nvcc, python, storage, fips.
	Name() string
	// Measure returns the probe's section of the facts. It returns an
	// error only when ctx ends; what could not be measured is described
	// in the section itself.
	Measure(ctx context.Context) (Section, error)
}

// Keyed is implemented by probes whose result can only change when some
// observable state changes (a binary replaced, a package installed). The
// suite reuses the previous section while StateKey returns the same value.
// Probes that measure live quantities (free memory, GPU processes, free
// space) do not implement it and are always measured again.
type Keyed interface {
	// StateKey returns a key for the state the previous measurement
	// depends on, or ok=false when it cannot tell (then the probe runs).
	StateKey(ctx context.Context, prev Section) (key string, ok bool)
}

// Section is the part of Facts one probe fills.
type Section interface {
	apply(f *Facts)
}

// Facts is everything the probes measured.
type Facts struct {
	GPU     GPUSection     `json:"gpu"`
	NVCC    NVCCSection    `json:"nvcc"`
	Python  PythonSection  `json:"python"`
	Storage StorageSection `json:"storage"`
	FIPS    FIPSSection    `json:"fips"`
}

// Simulated reports whether any section came from a simulated profile.
func (f *Facts) Simulated() bool {
	return f.GPU.Simulated || f.NVCC.Simulated || f.Python.Simulated
}

// Apply copies a section into f.
func (f *Facts) Apply(s Section) { s.apply(f) }

// GPUSection is what a GPUSource reports.
type GPUSection struct {
	// Available is false when no GPU library answered; Reason says why
	// ("NVML not available: …").
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	Simulated bool   `json:"simulated,omitempty"`
	Profile   string `json:"profile,omitempty"`
	// Class is the accelerator class (h100-sxm5, a100-80gb, …) derived
	// from the device name.
	Class         string `json:"class,omitempty"`
	DriverVersion string `json:"driver_version,omitempty"`
	// CUDADriverAPI is the highest CUDA version the driver supports, as
	// cuDriverGetVersion reports it ("12.4").
	CUDADriverAPI string `json:"cuda_driver_api,omitempty"`
	GPUs          []GPU  `json:"gpus,omitempty"`
}

func (s GPUSection) apply(f *Facts) { f.GPU = s }

// GPU is one device.
type GPU struct {
	Index          int    `json:"index"`
	Name           string `json:"name"`
	UUID           string `json:"uuid"`
	Serial         string `json:"serial,omitempty"`
	VBIOS          string `json:"vbios,omitempty"`
	MemoryTotalMiB uint64 `json:"memory_total_mib"`
	MemoryFreeMiB  uint64 `json:"memory_free_mib"`
	PCIeGen        int    `json:"pcie_gen,omitempty"`
	PCIeWidth      int    `json:"pcie_width,omitempty"`
	// NVLinkActive counts links in the enabled state; NVLinkLinks counts
	// links the device answered for (0 when it has no NVLink).
	NVLinkActive int       `json:"nvlink_active"`
	NVLinkLinks  int       `json:"nvlink_links"`
	Processes    []Process `json:"processes,omitempty"`
	// Errors lists fields the library could not answer, so a partial
	// answer is visible instead of silently zero.
	Errors []string `json:"errors,omitempty"`
}

// Process is a process holding GPU memory.
type Process struct {
	PID           uint32 `json:"pid"`
	UsedMemoryMiB uint64 `json:"used_memory_mib"`
}

// NVCCSection is the CUDA toolkit as nvcc reports it.
type NVCCSection struct {
	Found     bool   `json:"found"`
	Reason    string `json:"reason,omitempty"`
	Path      string `json:"path,omitempty"`
	Version   string `json:"version,omitempty"` // 12.1.105
	Simulated bool   `json:"simulated,omitempty"`
}

func (s NVCCSection) apply(f *Facts) { f.NVCC = s }

// PythonSection is the configured Python runtime.
type PythonSection struct {
	Found      bool   `json:"found"`
	Reason     string `json:"reason,omitempty"`
	Executable string `json:"executable,omitempty"`
	Version    string `json:"version,omitempty"` // 3.10.12
	SysVersion string `json:"sys_version,omitempty"`
	// Torch is torch.__version__ ("2.1.0+cu121"); empty when torch is
	// not importable, with TorchReason saying why.
	Torch       string `json:"torch,omitempty"`
	TorchReason string `json:"torch_reason,omitempty"`
	TorchCUDA   string `json:"torch_cuda,omitempty"`
	CuDNN       string `json:"cudnn,omitempty"`
	TorchConfig string `json:"torch_config,omitempty"`
	// Packages maps PEP 503 names to installed versions; "" means not
	// installed.
	Packages map[string]string `json:"packages,omitempty"`
	// SitePaths are the interpreter's sys.path directories; their
	// modification times make up the cache key.
	SitePaths []string `json:"site_paths,omitempty"`
	Simulated bool     `json:"simulated,omitempty"`
}

func (s PythonSection) apply(f *Facts) { f.Python = s }

// StorageSection is the storage of a work path.
type StorageSection struct {
	Path         string   `json:"path"`
	Reason       string   `json:"reason,omitempty"`
	MountPoint   string   `json:"mount_point,omitempty"`
	Source       string   `json:"source,omitempty"`
	FSType       string   `json:"fs_type,omitempty"`
	MountOptions []string `json:"mount_options,omitempty"`
	FreeBytes    uint64   `json:"free_bytes"`
	TotalBytes   uint64   `json:"total_bytes"`
	// ReadMBps is sequential read throughput in MB/s (10^6 bytes);
	// zero when the read probe did not run. ReadNote says how it was
	// measured (direct I/O, or page cache dropped with fadvise).
	ReadMBps float64 `json:"read_mbps,omitempty"`
	ReadNote string  `json:"read_note,omitempty"`
}

func (s StorageSection) apply(f *Facts) { f.Storage = s }

// HasOption reports whether the mount has option opt.
func (s StorageSection) HasOption(opt string) bool {
	for _, o := range s.MountOptions {
		if o == opt {
			return true
		}
	}
	return false
}

// FIPSSection is the kernel FIPS mode.
type FIPSSection struct {
	Found   bool   `json:"found"`
	Reason  string `json:"reason,omitempty"`
	Enabled bool   `json:"enabled"`
}

func (s FIPSSection) apply(f *Facts) { f.FIPS = s }

// NormalizePackage returns the PEP 503 normalised form of a package name.
func NormalizePackage(name string) string {
	var b strings.Builder
	sep := false
	for _, r := range strings.ToLower(strings.TrimSpace(name)) {
		if r == '-' || r == '_' || r == '.' {
			sep = true
			continue
		}
		if sep && b.Len() > 0 {
			b.WriteByte('-')
		}
		sep = false
		b.WriteRune(r)
	}
	return b.String()
}
