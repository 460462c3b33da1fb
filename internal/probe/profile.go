package probe

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
)

//go:embed profiles/*.json
var profileFS embed.FS

// Profile is a simulated hardware profile: what NVML (and, when Runtime
// is set, nvcc and Python) would report on a real node of that type. It
// lets tests and `gpupass up` run without GPUs; every section made from
// it says Simulated, and reports made from those say "simulated": true.
type Profile struct {
	Name             string          `json:"name"`
	Description      string          `json:"description"`
	AcceleratorClass string          `json:"accelerator_class"`
	DriverVersion    string          `json:"driver_version"`
	CUDADriverAPI    string          `json:"cuda_driver_api"`
	CUDAToolkit      string          `json:"cuda_toolkit,omitempty"`
	Runtime          *ProfileRuntime `json:"runtime,omitempty"`
	GPU              ProfileGPU      `json:"gpu"`

	// seed makes UUIDs and serials differ between simulated nodes that
	// share a profile, and stay the same across restarts of one node.
	seed string
}

// ProfileRuntime is the simulated software runtime.
type ProfileRuntime struct {
	Python    string            `json:"python"`
	PyTorch   string            `json:"pytorch"`
	TorchCUDA string            `json:"torch_cuda"`
	CuDNN     string            `json:"cudnn"`
	Packages  map[string]string `json:"packages,omitempty"`
}

// ProfileGPU describes the (identical) GPUs of a profile.
type ProfileGPU struct {
	Name           string `json:"name"`
	Count          int    `json:"count"`
	MemoryTotalMiB uint64 `json:"memory_total_mib"`
	MemoryUsedMiB  uint64 `json:"memory_used_mib"`
	PCIeGen        int    `json:"pcie_gen"`
	PCIeWidth      int    `json:"pcie_width"`
	NVLinkLinks    int    `json:"nvlink_links"`
	VBIOS          string `json:"vbios"`
	SerialPrefix   string `json:"serial_prefix"`
}

// ProfileNames lists the built-in profiles.
func ProfileNames() []string {
	entries, _ := fs.ReadDir(profileFS, "profiles")
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	sort.Strings(names)
	return names
}

// LoadProfile loads a built-in profile by name, or a profile JSON file by
// path (anything with a slash or ending in .json).
func LoadProfile(nameOrPath string) (*Profile, error) {
	var b []byte
	var err error
	src := nameOrPath
	if strings.ContainsRune(nameOrPath, '/') || strings.HasSuffix(nameOrPath, ".json") {
		b, err = os.ReadFile(nameOrPath)
		if err != nil {
			return nil, fmt.Errorf("reading profile: %w", err)
		}
	} else {
		b, err = profileFS.ReadFile(path.Join("profiles", nameOrPath+".json"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("unknown simulated profile %q: use one of %s or a path to a profile JSON file", nameOrPath, strings.Join(ProfileNames(), ", "))
		}
		if err != nil {
			return nil, err
		}
		src = "built-in profile " + nameOrPath
	}
	return ParseProfile(src, b)
}

// ParseProfile decodes and checks a profile; src names it in errors.
func ParseProfile(src string, b []byte) (*Profile, error) {
	var p Profile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	var errs []string
	check := func(ok bool, field, fix string) {
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: field %s %s", src, field, fix))
		}
	}
	check(p.Name != "", "name", "is required")
	check(p.DriverVersion != "", "driver_version", "is required (e.g. 535.104.05)")
	check(p.CUDADriverAPI != "", "cuda_driver_api", "is required (e.g. 12.2)")
	check(p.GPU.Name != "", "gpu.name", "is required (the NVML device name)")
	check(p.GPU.Count >= 1 && p.GPU.Count <= 64, "gpu.count", "must be between 1 and 64")
	check(p.GPU.MemoryTotalMiB > 0, "gpu.memory_total_mib", "must be positive")
	check(p.GPU.MemoryUsedMiB <= p.GPU.MemoryTotalMiB, "gpu.memory_used_mib", "must not exceed memory_total_mib")
	check(p.GPU.NVLinkLinks >= 0 && p.GPU.NVLinkLinks <= 36, "gpu.nvlink_links", "must be between 0 and 36")
	if p.Runtime != nil {
		check(p.Runtime.Python != "", "runtime.python", "is required when runtime is given")
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	if p.AcceleratorClass == "" {
		p.AcceleratorClass = ClassOf(p.GPU.Name, p.GPU.MemoryTotalMiB)
	}
	return &p, nil
}

// WithSeed returns a copy whose device UUIDs and serials derive from seed
// (an agent's identity), so simulated nodes are told apart.
func (p *Profile) WithSeed(seed string) *Profile {
	c := *p
	c.seed = seed
	return &c
}

func (p *Profile) hash(i int) [32]byte {
	return sha256.Sum256(fmt.Appendf(nil, "%s|%s|%d", p.seed, p.Name, i))
}

// GPUProbe returns a probe that answers with the profile's GPUs.
func (p *Profile) GPUProbe() Probe { return profileGPU{p} }

// NVCCProbe returns a probe answering with the profile's toolkit, or nil
// when the profile has none.
func (p *Profile) NVCCProbe() Probe {
	if p.CUDAToolkit == "" {
		return nil
	}
	return profileNVCC{p}
}

// PythonProbe returns a probe answering with the profile's runtime for
// packages, or nil when the profile has no runtime (the real Python is
// probed then).
func (p *Profile) PythonProbe(packages []string) Probe {
	if p.Runtime == nil {
		return nil
	}
	return profilePython{p, packages}
}

type profileGPU struct{ p *Profile }

func (profileGPU) Name() string { return "gpu" }

func (g profileGPU) Measure(ctx context.Context) (Section, error) {
	p := g.p
	s := GPUSection{
		Available: true, Simulated: true, Profile: p.Name, Class: p.AcceleratorClass,
		DriverVersion: p.DriverVersion, CUDADriverAPI: p.CUDADriverAPI,
	}
	for i := 0; i < p.GPU.Count; i++ {
		h := p.hash(i)
		gpu := GPU{
			Index: i, Name: p.GPU.Name,
			UUID:           fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16]),
			VBIOS:          p.GPU.VBIOS,
			MemoryTotalMiB: p.GPU.MemoryTotalMiB, MemoryFreeMiB: p.GPU.MemoryTotalMiB - p.GPU.MemoryUsedMiB,
			PCIeGen: p.GPU.PCIeGen, PCIeWidth: p.GPU.PCIeWidth,
			NVLinkActive: p.GPU.NVLinkLinks, NVLinkLinks: p.GPU.NVLinkLinks,
		}
		if p.GPU.SerialPrefix != "" {
			gpu.Serial = fmt.Sprintf("%s%05d", p.GPU.SerialPrefix, (int(h[16])<<8|int(h[17]))%100000)
		}
		s.GPUs = append(s.GPUs, gpu)
	}
	return s, ctx.Err()
}

type profileNVCC struct{ p *Profile }

func (profileNVCC) Name() string { return "nvcc" }

func (n profileNVCC) Measure(ctx context.Context) (Section, error) {
	return NVCCSection{Found: true, Path: "simulated:" + n.p.Name, Version: n.p.CUDAToolkit, Simulated: true}, ctx.Err()
}

type profilePython struct {
	p        *Profile
	packages []string
}

func (profilePython) Name() string { return "python" }

func (pp profilePython) Measure(ctx context.Context) (Section, error) {
	r := pp.p.Runtime
	installed := map[string]string{}
	for name, v := range r.Packages {
		installed[NormalizePackage(name)] = v
	}
	pk := map[string]string{}
	for _, name := range pp.packages {
		n := NormalizePackage(name)
		pk[n] = installed[n]
	}
	return PythonSection{
		Found: true, Executable: "simulated:" + pp.p.Name, Version: r.Python,
		Torch: r.PyTorch, TorchCUDA: r.TorchCUDA, CuDNN: r.CuDNN,
		Packages: pk, Simulated: true,
	}, ctx.Err()
}
