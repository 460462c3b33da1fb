package suite

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/probe"
)

// CheckNames lists the checks in the order they are reported.
var CheckNames = []string{
	"driver.version", "cuda.driver_api", "cuda.toolkit", "python.version", "torch.version",
	"torch.abi", "cudnn.version", "gpu.count", "gpu.class", "gpu.memory.free",
	"gpu.foreign_processes", "pcie.link", "nvlink.state", "storage.fs", "storage.mount_options",
	"storage.free", "storage.read_mbps", "fips.enabled",
}

type verdict struct {
	expected, actual string
	status           conformance.Status
	message          string
}

type check struct {
	name string
	deps []string // probe names the result is built from
	eval func(f *probe.Facts, e Expectations) verdict
}

const notFound = "not found"

// noGPUs explains why the per-GPU checks are skipped: gpu.count already
// fails for a node without GPUs, once is enough.
const noGPUs = "no GPUs (see gpu.count)"

var checks = []check{
	{"driver.version", []string{"gpu"}, func(f *probe.Facts, e Expectations) verdict {
		return exact(e.NvidiaDriver, f.GPU.DriverVersion, f.GPU.Available, f.GPU.Reason)
	}},
	{"cuda.driver_api", []string{"gpu", "nvcc"}, func(f *probe.Facts, e Expectations) verdict {
		// The driver must support at least the toolkit's major.minor.
		tk := e.CUDA
		if tk == "" && f.NVCC.Found {
			tk = f.NVCC.Version
		}
		if !f.GPU.Available {
			return verdict{expected: geq(majorMinor(tk)), actual: notFound, status: statusMissing(tk != ""), message: f.GPU.Reason}
		}
		if tk == "" {
			return verdict{actual: f.GPU.CUDADriverAPI, status: conformance.Pass}
		}
		v := verdict{expected: geq(majorMinor(tk)), actual: f.GPU.CUDADriverAPI, status: conformance.Pass}
		if compareVersions(f.GPU.CUDADriverAPI, majorMinor(tk)) < 0 {
			v.status = conformance.Fail
			v.message = fmt.Sprintf("driver supports CUDA %s, older than toolkit %s", f.GPU.CUDADriverAPI, tk)
		}
		return v
	}},
	{"cuda.toolkit", []string{"nvcc"}, func(f *probe.Facts, e Expectations) verdict {
		return exact(e.CUDA, f.NVCC.Version, f.NVCC.Found, f.NVCC.Reason)
	}},
	{"python.version", []string{"python"}, func(f *probe.Facts, e Expectations) verdict {
		return exact(e.Python, f.Python.Version, f.Python.Found, f.Python.Reason)
	}},
	{"torch.version", []string{"python"}, func(f *probe.Facts, e Expectations) verdict {
		return exact(e.PyTorch, f.Python.Torch, f.Python.Torch != "", torchReason(f))
	}},
	{"torch.abi", []string{"python", "nvcc"}, func(f *probe.Facts, e Expectations) verdict {
		// torch's local tag (cu121), the CUDA it was built with and the
		// toolkit that JIT-builds extensions must agree on major.minor.
		if f.Python.Torch == "" {
			return verdict{actual: notFound, status: statusMissing(e.PyTorch != ""), message: torchReason(f)}
		}
		tag := localTag(f.Python.Torch)
		actual := tag
		if actual == "" {
			actual = "no local tag"
		}
		if f.Python.TorchCUDA != "" {
			actual += " (torch.version.cuda " + f.Python.TorchCUDA + ")"
		}
		tk := e.CUDA
		if tk == "" && f.NVCC.Found {
			tk = f.NVCC.Version
		}
		if tk == "" {
			return verdict{actual: actual, status: conformance.Pass}
		}
		want := "cu" + strings.ReplaceAll(majorMinor(tk), ".", "")
		v := verdict{expected: want, actual: actual, status: conformance.Pass}
		switch {
		case tag != want:
			v.status, v.message = conformance.Fail, fmt.Sprintf("torch %s was not built for CUDA %s", f.Python.Torch, majorMinor(tk))
		case f.Python.TorchCUDA != "" && majorMinor(f.Python.TorchCUDA) != majorMinor(tk):
			v.status, v.message = conformance.Fail, fmt.Sprintf("torch.version.cuda %s differs from CUDA %s", f.Python.TorchCUDA, majorMinor(tk))
		}
		return v
	}},
	{"cudnn.version", []string{"python"}, func(f *probe.Facts, e Expectations) verdict {
		if f.Python.CuDNN == "" {
			msg := "torch reports no cuDNN"
			if f.Python.Torch == "" {
				msg = torchReason(f)
			}
			return verdict{actual: notFound, status: statusMissing(e.PyTorch != "" && localTag(e.PyTorch) != "cpu" && localTag(e.PyTorch) != ""), message: msg}
		}
		return verdict{actual: f.Python.CuDNN, status: conformance.Pass}
	}},
	{"gpu.count", []string{"gpu"}, func(f *probe.Facts, e Expectations) verdict {
		n := len(f.GPU.GPUs)
		v := verdict{actual: strconv.Itoa(n), status: conformance.Pass}
		if e.Count > 0 {
			v.expected = geq(strconv.Itoa(e.Count))
		}
		switch {
		case n == 0:
			// A node without GPUs has nothing to offer, spec or not.
			v.status, v.message = conformance.Fail, "no GPUs"
			if f.GPU.Reason != "" {
				v.message = "no GPUs: " + f.GPU.Reason
			}
		case n < e.Count:
			v.status = conformance.Fail
		}
		return v
	}},
	{"gpu.class", []string{"gpu"}, func(f *probe.Facts, e Expectations) verdict {
		if !f.GPU.Available || len(f.GPU.GPUs) == 0 {
			return verdict{expected: e.Accelerator, actual: notFound, status: statusMissing(e.Accelerator != ""), message: f.GPU.Reason}
		}
		actual := f.GPU.Class
		if actual == "" {
			actual = "unknown (" + f.GPU.GPUs[0].Name + ")"
		}
		var mixed []string
		for _, g := range f.GPU.GPUs {
			if g.Name != f.GPU.GPUs[0].Name && !slices.Contains(mixed, g.Name) {
				mixed = append(mixed, g.Name)
			}
		}
		v := exact(e.Accelerator, actual, true, "")
		if len(mixed) > 0 {
			v.status, v.message = conformance.Fail, "mixed GPU models: "+f.GPU.GPUs[0].Name+", "+strings.Join(mixed, ", ")
		}
		return v
	}},
	{"gpu.memory.free", []string{"gpu"}, func(f *probe.Facts, e Expectations) verdict {
		floor := e.MinFreeMemoryPct
		if floor == 0 {
			floor = 95
		}
		exp := fmt.Sprintf(">= %g%% free on every GPU", floor)
		if len(f.GPU.GPUs) == 0 {
			return verdict{expected: exp, actual: notFound, status: conformance.Skip, message: noGPUs}
		}
		minPct, worst := 101.0, 0
		for _, g := range f.GPU.GPUs {
			if g.MemoryTotalMiB == 0 {
				continue
			}
			pct := float64(g.MemoryFreeMiB) / float64(g.MemoryTotalMiB) * 100
			if pct < minPct {
				minPct, worst = pct, g.Index
			}
		}
		if minPct > 100 {
			return verdict{expected: exp, actual: "memory not reported", status: conformance.Fail}
		}
		v := verdict{expected: exp, actual: fmt.Sprintf("%.1f%% free (lowest: GPU %d)", minPct, worst), status: conformance.Pass}
		if minPct < floor {
			v.status = conformance.Fail
		}
		return v
	}},
	{"gpu.foreign_processes", []string{"gpu"}, func(f *probe.Facts, e Expectations) verdict {
		if len(f.GPU.GPUs) == 0 {
			return verdict{expected: "0", actual: notFound, status: conformance.Skip, message: noGPUs}
		}
		var held []string
		for _, g := range f.GPU.GPUs {
			for _, p := range g.Processes {
				if e.OwnPIDs[p.PID] {
					continue
				}
				held = append(held, fmt.Sprintf("GPU %d: pid %d (%d MiB)", g.Index, p.PID, p.UsedMemoryMiB))
			}
		}
		v := verdict{expected: "0", actual: strconv.Itoa(len(held)), status: conformance.Pass}
		if len(held) > 0 {
			v.status, v.message = conformance.Fail, strings.Join(held, "; ")
		}
		return v
	}},
	{"pcie.link", []string{"gpu"}, func(f *probe.Facts, e Expectations) verdict {
		// A link that trained below the board's generation or width
		// (a loose riser, a bad slot) halves host transfers silently.
		if len(f.GPU.GPUs) == 0 {
			return verdict{actual: notFound, status: conformance.Skip, message: noGPUs}
		}
		maxGen := 0
		for _, g := range f.GPU.GPUs {
			maxGen = max(maxGen, g.PCIeGen)
		}
		if maxGen == 0 {
			return verdict{actual: "not reported", status: conformance.Warn}
		}
		counts := map[string]int{}
		var bad []string
		for _, g := range f.GPU.GPUs {
			l := fmt.Sprintf("Gen%d x%d", g.PCIeGen, g.PCIeWidth)
			counts[l]++
			if g.PCIeGen < maxGen || g.PCIeWidth < 16 {
				bad = append(bad, fmt.Sprintf("GPU %d at %s", g.Index, l))
			}
		}
		v := verdict{expected: fmt.Sprintf("Gen%d x16 on every GPU", maxGen), actual: summarize(counts), status: conformance.Pass}
		if len(bad) > 0 {
			v.status, v.message = conformance.Fail, "degraded link: "+strings.Join(bad, ", ")
		}
		return v
	}},
	{"nvlink.state", []string{"gpu"}, func(f *probe.Facts, e Expectations) verdict {
		if len(f.GPU.GPUs) == 0 {
			return verdict{actual: notFound, status: conformance.Skip, message: noGPUs}
		}
		maxLinks, active, total := 0, 0, 0
		for _, g := range f.GPU.GPUs {
			maxLinks = max(maxLinks, g.NVLinkLinks)
		}
		if maxLinks == 0 {
			return verdict{actual: "no NVLink", status: conformance.Pass}
		}
		var down []string
		for _, g := range f.GPU.GPUs {
			active += g.NVLinkActive
			total += maxLinks
			if g.NVLinkActive < maxLinks {
				down = append(down, fmt.Sprintf("GPU %d: %d/%d", g.Index, g.NVLinkActive, maxLinks))
			}
		}
		v := verdict{expected: fmt.Sprintf("%d/%d links active", total, total), actual: fmt.Sprintf("%d/%d links active", active, total), status: conformance.Pass}
		if len(down) > 0 {
			v.status, v.message = conformance.Fail, "links down: "+strings.Join(down, ", ")
		}
		return v
	}},
	{"storage.fs", []string{"storage"}, func(f *probe.Facts, e Expectations) verdict {
		s := f.Storage
		if s.FSType == "" {
			return verdict{actual: notFound, status: conformance.Fail, message: s.Reason}
		}
		v := verdict{actual: fmt.Sprintf("%s on %s (%s)", s.FSType, s.MountPoint, s.Source), status: conformance.Pass}
		if strings.HasSuffix(e.StorageClass, "nvme") {
			v.expected = "local filesystem for " + e.StorageClass
			if networkFS[s.FSType] || strings.HasPrefix(s.FSType, "fuse") {
				v.status, v.message = conformance.Fail, s.FSType+" is a network or FUSE filesystem, not local NVMe"
			}
		}
		return v
	}},
	{"storage.mount_options", []string{"storage"}, func(f *probe.Facts, e Expectations) verdict {
		s := f.Storage
		if s.FSType == "" {
			return verdict{expected: "noatime", actual: notFound, status: conformance.Fail, message: s.Reason}
		}
		v := verdict{expected: "noatime", actual: strings.Join(s.MountOptions, ","), status: conformance.Pass}
		if !s.HasOption("noatime") {
			// Access-time updates turn every checkpoint read into a write;
			// worth fixing, but not a reason to refuse the node.
			v.status, v.message = conformance.Warn, "mounted without noatime: reads also write access times"
		}
		return v
	}},
	{"storage.free", []string{"storage"}, func(f *probe.Facts, e Expectations) verdict {
		s := f.Storage
		if s.TotalBytes == 0 {
			return verdict{actual: notFound, status: conformance.Fail, message: s.Reason}
		}
		gb := float64(s.FreeBytes) / 1e9
		v := verdict{actual: fmt.Sprintf("%.1f GB", gb), status: conformance.Pass}
		if e.StorageSizeGB > 0 {
			v.expected = fmt.Sprintf(">= %d GB", e.StorageSizeGB)
			if gb < float64(e.StorageSizeGB) {
				v.status = conformance.Fail
			}
		}
		return v
	}},
	{"storage.read_mbps", []string{"storage.read"}, func(f *probe.Facts, e Expectations) verdict {
		s := f.Storage
		if s.ReadMBps == 0 {
			return verdict{actual: "not measured", status: conformance.Skip, message: s.ReadNote}
		}
		v := verdict{actual: fmt.Sprintf("%.0f MB/s", s.ReadMBps), status: conformance.Pass, message: s.ReadNote}
		if floor, ok := readFloorMBps[e.StorageClass]; ok {
			v.expected = fmt.Sprintf(">= %.0f MB/s (%s)", floor, e.StorageClass)
			if s.ReadMBps < floor {
				// Below the sold class: the broker records an SLA
				// violation; the software environment is still sound.
				v.status = conformance.Warn
				v.message = fmt.Sprintf("below the %s floor; %s", e.StorageClass, s.ReadNote)
			}
		}
		return v
	}},
	{"fips.enabled", []string{"fips"}, func(f *probe.Facts, e Expectations) verdict {
		v := verdict{actual: strconv.FormatBool(f.FIPS.Enabled), status: conformance.Pass, message: f.FIPS.Reason}
		if e.FIPS {
			v.expected = "true"
			if !f.FIPS.Enabled {
				v.status = conformance.Fail
			}
		}
		return v
	}},
}

func evaluate(f *probe.Facts, e Expectations, took map[string]time.Duration, reused map[string]bool) []conformance.Check {
	out := make([]conformance.Check, 0, len(checks))
	for _, c := range checks {
		t0 := time.Now()
		v := c.eval(f, e)
		d := time.Since(t0)
		allReused := true
		for _, p := range c.deps {
			d += took[p]
			allReused = allReused && reused[p]
		}
		out = append(out, conformance.Check{
			Name: c.name, Expected: v.expected, Actual: v.actual, Status: v.status,
			DurationMS: float64(d.Microseconds()) / 1000, Message: v.message, Cached: allReused,
		})
	}
	return out
}

// exact compares a declared value with a measured one.
func exact(expected, actual string, found bool, reason string) verdict {
	if !found || actual == "" {
		return verdict{expected: expected, actual: notFound, status: statusMissing(expected != ""), message: reason}
	}
	v := verdict{expected: expected, actual: actual, status: conformance.Pass}
	if expected != "" && expected != actual {
		v.status = conformance.Fail
	}
	return v
}

// statusMissing: something absent fails when it was asked for and is
// skipped when nobody declared it.
func statusMissing(required bool) conformance.Status {
	if required {
		return conformance.Fail
	}
	return conformance.Skip
}

func torchReason(f *probe.Facts) string {
	if !f.Python.Found {
		return "python " + f.Python.Reason
	}
	return "torch " + f.Python.TorchReason
}

func geq(v string) string {
	if v == "" {
		return ""
	}
	return ">= " + v
}

func localTag(torch string) string {
	_, tag, _ := strings.Cut(torch, "+")
	return tag
}

// majorMinor returns "12.1" of "12.1.105".
func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

// compareVersions compares dotted numeric versions.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

func summarize(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s on %d", k, counts[k])
	}
	return strings.Join(parts, ", ")
}

// Evaluate runs the checks over facts measured earlier (durations are
// the evaluation time only; nothing is marked cached).
func Evaluate(f *probe.Facts, e Expectations) []conformance.Check {
	return evaluate(f, e, nil, nil)
}
