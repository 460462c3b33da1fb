package spec

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// dotted matches s against min to max dot-separated decimal numbers,
// returning what FindStringSubmatch of `^(\d+)(?:\.(\d+))?…$` would (s,
// then max numbers, "" for those absent), or nil. It replaces the five
// regexps these rules were written with: compiling them was most of the
// spec package's start-up, paid by every gpupass process
// (TestSmallMatchersMatchRegexps holds them to each other).
func dotted(s string, min, max int) []string {
	m := make([]string, 1, 1+max)
	m[0] = s
	for part := range strings.SplitSeq(s, ".") {
		if part == "" || strings.Trim(part, "0123456789") != "" || len(m) > max {
			return nil
		}
		m = append(m, part)
	}
	if len(m)-1 < min {
		return nil
	}
	for len(m) < 1+max {
		m = append(m, "")
	}
	return m
}

// cudaExact: major.minor.patch, as `^(\d+)\.(\d+)\.(\d+)$`.
func cudaExact(s string) []string { return dotted(s, 3, 3) }

// cudaPartial: major[.minor], as `^(\d+)(?:\.(\d+))?$`.
func cudaPartial(s string) []string { return dotted(s, 1, 2) }

// driverMatch: major.minor[.patch], as `^(\d+)\.(\d+)(?:\.(\d+))?$`.
func driverMatch(s string) []string { return dotted(s, 2, 3) }

// pythonMatch: 3.minor[.patch], as `^3\.(\d+)(?:\.(\d+))?$` (s, minor, patch).
func pythonMatch(s string) []string {
	m := dotted(s, 2, 3)
	if m == nil || m[1] != "3" {
		return nil
	}
	return []string{s, m[2], m[3]}
}

// isCUDATag: a torch wheel's CUDA tag, as `^cu(\d+)$`.
func isCUDATag(s string) bool {
	n, ok := strings.CutPrefix(s, "cu")
	return ok && n != "" && strings.Trim(n, "0123456789") == ""
}

// mallocAsyncMinDriver: cudaMemPoolAttrReleaseThreshold behaves as
// documented from this driver on (the 535 branch).
const mallocAsyncMinDriver = "535.86.01"

// checker runs the semantic rules over a parsed document.
type checker struct {
	d        *Document
	findings []Finding
	cudaMM   string // "12.1" when runtime.cuda parsed, else ""
}

func (c *checker) add(rule string, sev Severity, path, msg, fix string) {
	pos := c.d.At(path)
	c.findings = append(c.findings, Finding{
		Rule: rule, Severity: sev, File: c.d.File, Line: pos.Line, Column: pos.Column,
		Path: path, Message: msg, Fix: fix,
	})
}

// Check runs every rule over d and returns all findings at once.
func Check(d *Document) []Finding {
	c := &checker{d: d}
	c.required()
	c.cuda()
	c.driver()
	c.torchAndPython()
	c.packages()
	c.malloc()
	c.bundle()
	c.resources()
	c.timeLimit()
	c.queueTimeout()
	c.metricPattern()
	return c.findings
}

func (c *checker) required() {
	s := &c.d.Spec
	if !c.d.Has("name") && !c.d.Invalid("name") {
		c.add("spec.required", SevError, "name", "name is required", "add `name: my-training-job`")
	}
	if !c.d.Has("runtime") {
		if !c.d.Invalid("runtime") {
			c.add("spec.required", SevError, "runtime", "runtime is required: it declares cuda, nvidia-driver, python, pytorch and packages",
				"run `gpupass init` in an empty directory to see a complete spec")
		}
		return
	}
	for _, f := range []struct{ path, val, fix string }{
		{"runtime.cuda", s.Runtime.CUDA, "add `cuda: 12.1.105` (the exact toolkit version from `nvcc --version`)"},
		{"runtime.nvidia-driver", s.Runtime.NvidiaDriver, "add `nvidia-driver: 535.104.05` (from `nvidia-smi`)"},
		{"runtime.python", s.Runtime.Python, "add `python: 3.10.12`"},
		{"runtime.pytorch", s.Runtime.PyTorch, "add `pytorch: 2.1.0+cu121` (version with its CUDA tag)"},
	} {
		if f.val == "" && !c.d.Invalid(f.path) {
			c.add("spec.required", SevError, f.path, f.path+" is required", f.fix)
		}
	}
}

// cuda checks runtime.cuda and sets cudaMM ("12.1") for the rules that
// depend on the release: from an exact version, and from a major.minor
// one too, which is an error of its own but names the release, so the
// driver, PyTorch and package findings come in the same run and fixing
// cuda as told brings no new ones.
func (c *checker) cuda() {
	v := c.d.Spec.Runtime.CUDA
	if v == "" {
		return
	}
	m := cudaExact(v)
	exact := m != nil
	if !exact {
		if m = cudaPartial(v); m != nil && m[2] == "" {
			m = nil // "12": no release named
		}
	}
	if m != nil {
		c.cudaMM = m[1] + "." + strings.TrimLeft(m[2], "0")
		if c.cudaMM == m[1]+"." {
			c.cudaMM += "0"
		}
	}
	t, known := tbl().cuda[c.cudaMM]
	if m != nil && !known {
		c.add("cuda.unknown-release", SevWarning, "runtime.cuda",
			fmt.Sprintf("CUDA %s is not in gpupass's driver table (covers %s to %s); the driver cannot be checked against it",
				c.cudaMM, tbl().cudaOrder[0], tbl().cudaOrder[len(tbl().cudaOrder)-1]),
			"check the version, or add the release to internal/spec/data/cuda.json")
	}
	if exact {
		return
	}
	example := "12.1.105"
	if m != nil {
		if known && t.NVCC != "" {
			example = t.NVCC
		} else {
			example = m[1] + "." + m[2] + ".<patch>"
		}
		c.add("cuda.exact-version", SevError, "runtime.cuda",
			fmt.Sprintf("CUDA version %q is ambiguous: it names a minor release, not the exact toolkit", v),
			fmt.Sprintf("write major.minor.patch, e.g. %s (`nvcc --version` prints it after V)", example))
		return
	}
	c.add("cuda.exact-version", SevError, "runtime.cuda",
		fmt.Sprintf("CUDA version %q is not major.minor.patch", v),
		fmt.Sprintf("write the exact toolkit version, e.g. %s", example))
}

// driverVersion parses "535.104.05" into comparable numbers.
func driverVersion(s string) ([]int, bool) {
	m := driverMatch(s)
	if m == nil {
		return nil, false
	}
	var out []int
	for _, p := range m[1:] {
		if p == "" {
			p = "0"
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, false
		}
		out = append(out, n)
	}
	return out, true
}

func (c *checker) driver() {
	v := c.d.Spec.Runtime.NvidiaDriver
	if v == "" {
		return
	}
	have, ok := driverVersion(v)
	if !ok {
		c.add("driver.version", SevError, "runtime.nvidia-driver",
			fmt.Sprintf("NVIDIA driver %q is not a full driver version", v),
			"write the version `nvidia-smi` prints, e.g. 535.104.05")
		return
	}
	if c.cudaMM == "" {
		return
	}
	t, ok := tbl().cuda[c.cudaMM]
	if !ok {
		return
	}
	need, _ := driverVersion(t.MinDriver)
	if slices.Compare(have, need) < 0 {
		c.add("driver.too-old", SevError, "runtime.nvidia-driver",
			fmt.Sprintf("NVIDIA driver %s is older than CUDA %s needs (>= %s)", v, c.cudaMM, t.MinDriver),
			fmt.Sprintf("use driver %s or newer, or an older CUDA toolkit", t.MinDriver))
	}
}

func (c *checker) torchAndPython() {
	r := &c.d.Spec.Runtime
	py := r.Python
	pyMM := ""
	if py != "" {
		if m := pythonMatch(py); m == nil {
			c.add("python.version", SevError, "runtime.python",
				fmt.Sprintf("Python version %q is not a CPython 3 version", py), "write major.minor.patch, e.g. 3.10.12")
		} else {
			pyMM = "3." + strings.TrimLeft(m[1], "0")
			if m[2] == "" {
				c.add("python.version", SevError, "runtime.python",
					fmt.Sprintf("Python version %q names a minor release, not the exact interpreter", py),
					fmt.Sprintf("write major.minor.patch, e.g. %s.0 (`python3 --version` prints it)", py))
			}
		}
	}
	if r.PyTorch == "" {
		return
	}
	tv, err := ParseVersion(r.PyTorch)
	if err != nil {
		c.add("torch.version", SevError, "runtime.pytorch",
			fmt.Sprintf("PyTorch version %q is not a PEP 440 version", r.PyTorch), "write it as torch reports it, e.g. 2.1.0+cu121")
		return
	}
	wantTag := ""
	if c.cudaMM != "" {
		wantTag = "cu" + strings.ReplaceAll(c.cudaMM, ".", "")
	}
	rel, known := tbl().torchRelease(tv)
	switch {
	case tv.Local == "":
		fix := fmt.Sprintf("write it with its CUDA tag, e.g. %s+%s", tv.Public(), or(wantTag, "cu121"))
		c.add("torch.local-tag", SevError, "runtime.pytorch",
			fmt.Sprintf("PyTorch version %q has no local tag; the same version exists for several CUDA builds", r.PyTorch), fix)
	case tv.Local == "cpu":
		c.add("torch.local-tag", SevError, "runtime.pytorch",
			fmt.Sprintf("PyTorch %q is the CPU-only build; it cannot use the GPU", r.PyTorch),
			fmt.Sprintf("use the CUDA build, e.g. %s+%s", tv.Public(), or(wantTag, "cu121")))
	case !isCUDATag(tv.Local):
		c.add("torch.local-tag", SevError, "runtime.pytorch",
			fmt.Sprintf("PyTorch local tag %q is not a CUDA tag such as cu121", tv.Local),
			fmt.Sprintf("write %s+%s", tv.Public(), or(wantTag, "cu121")))
	default:
		if wantTag != "" && tv.Local != wantTag {
			c.add("torch.cuda-mismatch", SevError, "runtime.pytorch",
				fmt.Sprintf("PyTorch %s is built for %s but runtime.cuda is %s (%s)", r.PyTorch, cudaOfTag(tv.Local), r.CUDA, wantTag),
				fmt.Sprintf("use %s+%s, or set cuda to a %s toolkit", tv.Public(), wantTag, cudaOfTag(tv.Local)))
		}
		if known && !slices.Contains(rel.CUDA, tv.Local) {
			c.add("torch.unpublished", SevError, "runtime.pytorch",
				fmt.Sprintf("PyTorch %s was never published for %s (published: %s)", tv.Public(), tv.Local, strings.Join(rel.CUDA, ", ")),
				fmt.Sprintf("pick a published build, e.g. %s+%s, and a matching cuda", tv.Public(), rel.CUDA[len(rel.CUDA)-1]))
		}
	}
	if !known {
		first, last := tbl().torch[0].v, tbl().torch[len(tbl().torch)-1].v
		if tv.Compare(first) >= 0 && tv.Compare(last) <= 0 && tv.Pre == "" && tv.Dev < 0 {
			c.add("torch.unpublished", SevError, "runtime.pytorch",
				fmt.Sprintf("PyTorch %s does not exist (gpupass knows every release from %s to %s)", tv.Public(), first.Public(), last.Public()),
				"pick a released version, e.g. "+nearestTorch(tv))
		} else {
			c.add("torch.unknown-release", SevWarning, "runtime.pytorch",
				fmt.Sprintf("PyTorch %s is outside gpupass's table (%s to %s); its CUDA and Python support are not checked", tv.Public(), first.Public(), last.Public()),
				"add the release to internal/spec/data/torch.json")
		}
		return
	}
	if pyMM != "" && !slices.Contains(rel.Python, pyMM) {
		c.add("torch.python-unsupported", SevError, "runtime.python",
			fmt.Sprintf("PyTorch %s does not support Python %s (supported: %s)", tv.Public(), pyMM, strings.Join(rel.Python, ", ")),
			fmt.Sprintf("use Python %s, or a PyTorch release that supports %s", rel.Python[len(rel.Python)-1], pyMM))
	}
}

func nearestTorch(v Version) string {
	best := tbl().torch[0]
	for _, r := range tbl().torch {
		if r.v.Compare(v) <= 0 {
			best = r
		}
	}
	return best.Version
}

func cudaOfTag(tag string) string {
	d := strings.TrimPrefix(tag, "cu")
	if len(d) < 2 {
		return "CUDA " + d
	}
	return "CUDA " + d[:len(d)-1] + "." + d[len(d)-1:]
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (c *checker) packages() {
	seen := map[string]int{}
	cuda, cudaOK := Version{}, false
	if c.cudaMM != "" {
		cuda, cudaOK = mustVersion(c.cudaMM), true
	}
	for i, line := range c.d.Spec.Runtime.Packages {
		path := fmt.Sprintf("runtime.packages[%d]", i)
		req, err := ParseRequirement(line)
		if err != nil {
			fix := "write `name==version`, e.g. transformers==4.38.2"
			var me *MarkerError
			if errors.As(err, &me) {
				fix = me.Fix
			}
			c.add("package.syntax", SevError, path,
				fmt.Sprintf("package %q is not a PEP 508 requirement: %v", clip(line), err), fix)
			continue
		}
		name := NormalizeName(req.Name)
		if first, dup := seen[name]; dup {
			c.add("package.duplicate", SevError, path,
				fmt.Sprintf("package %s is listed twice (also at line %d; names compare per PEP 503)", name, c.d.At(fmt.Sprintf("runtime.packages[%d]", first)).Line),
				"keep one entry")
			continue
		}
		seen[name] = i
		ver, pinned := req.Pinned()
		if !pinned {
			what := "has no version"
			switch {
			case req.URL != "":
				what = "is installed from a URL"
			case len(req.Specs) > 0:
				what = fmt.Sprintf("is not pinned to one version (%s)", strings.TrimPrefix(req.Canonical, name))
			}
			c.add("package.unpinned", SevError, path,
				fmt.Sprintf("package %s %s; every package must be pinned with ==", name, what),
				fmt.Sprintf("pin it: %s==<version> (`pip freeze` shows the installed one)", name))
			continue
		}
		if name == "torch" && c.d.Spec.Runtime.PyTorch != "" {
			if tv, err := ParseVersion(c.d.Spec.Runtime.PyTorch); err == nil && tv.String() != ver.String() {
				c.add("package.torch-conflict", SevError, path,
					fmt.Sprintf("packages pin torch %s but runtime.pytorch is %s", ver, c.d.Spec.Runtime.PyTorch),
					"remove torch from packages; runtime.pytorch declares it")
			}
		}
		comp, ok := tbl().compiled[name]
		if !ok {
			continue
		}
		if cudaOK {
			for _, r := range comp.Ranges {
				if r.From != "" && ver.Compare(mustVersion(r.From)) < 0 || r.Before != "" && ver.Compare(mustVersion(r.Before)) >= 0 {
					continue
				}
				if r.MinCUDA != "" && cuda.Compare(mustVersion(r.MinCUDA)) < 0 || r.MaxCUDA != "" && cuda.Compare(mustVersion(r.MaxCUDA)) > 0 {
					c.add("package.cuda-unsupported", SevError, path,
						fmt.Sprintf("%s %s does not support CUDA %s (supports %s)", name, ver, c.cudaMM, cudaRange(r)),
						fmt.Sprintf("use a %s release that supports CUDA %s, or change runtime.cuda", name, c.cudaMM))
				}
			}
		}
		switch comp.Build {
		case "jit":
			c.add("package.nvcc-build", SevWarning, path,
				fmt.Sprintf("%s compiles CUDA kernels at run time (JIT); the node's nvcc must be CUDA %s or the build fails or mismatches", name, or(c.cudaMM, "as declared")),
				"prebuild the ops into the wheel (e.g. DS_BUILD_OPS=1 for deepspeed) and ship it in runtime.bundle, or make sure nodes carry the declared nvcc")
		case "source":
			c.add("package.nvcc-build", SevWarning, path,
				fmt.Sprintf("%s compiles CUDA code at install unless a wheel for this torch and CUDA exists; the node's nvcc must be CUDA %s", name, or(c.cudaMM, "as declared")),
				"build the wheel once and ship it in runtime.bundle")
		}
	}
}

func cudaRange(r compiledRange) string {
	switch {
	case r.MinCUDA != "" && r.MaxCUDA != "":
		return "CUDA " + r.MinCUDA + " to " + r.MaxCUDA
	case r.MinCUDA != "":
		return "CUDA " + r.MinCUDA + " and newer"
	}
	return "CUDA up to " + r.MaxCUDA
}

func (c *checker) malloc() {
	r := &c.d.Spec.Runtime
	if !c.d.Has("runtime.cuda-malloc-async-release-threshold") || r.CUDAMallocAsyncReleaseThreshold == "" {
		return
	}
	const path = "runtime.cuda-malloc-async-release-threshold"
	if _, err := ParseSize(r.CUDAMallocAsyncReleaseThreshold); err != nil {
		c.add("malloc.size", SevError, path, "release threshold: "+err.Error(), "write a positive size such as 2GB or 512MiB")
	}
	if !r.CUDAMallocAsync {
		c.add("malloc.needs-async", SevError, path,
			"cuda-malloc-async-release-threshold has no effect without cuda-malloc-async: true",
			"set `cuda-malloc-async: true`, or remove the threshold")
	}
	if have, ok := driverVersion(r.NvidiaDriver); ok {
		need, _ := driverVersion(mallocAsyncMinDriver)
		if slices.Compare(have, need) < 0 {
			c.add("malloc.driver-too-old", SevError, path,
				fmt.Sprintf("the async allocator's release threshold needs driver >= %s; nvidia-driver is %s", mallocAsyncMinDriver, r.NvidiaDriver),
				"raise nvidia-driver to 535.86.01 or newer, or remove the threshold")
		}
	}
}

func (c *checker) bundle() {
	s := &c.d.Spec
	if s.Runtime.Bundle == "" {
		if s.Security.NoInternetAccess {
			c.add("bundle.required", SevError, "security.no-internet-access",
				"no-internet-access: true needs runtime.bundle: nodes without internet install only from a wheel bundle",
				"push one with `gpupass bundle push` and add `bundle: registry/repo@sha256:<digest>` under runtime")
		}
		return
	}
	ref, err := ParseOCIRef(s.Runtime.Bundle)
	if err != nil {
		c.add("bundle.reference", SevError, "runtime.bundle", "runtime.bundle: "+err.Error(),
			"write registry/repository:tag or registry/repository@sha256:<digest>")
		return
	}
	switch {
	case ref.Digest == "" && s.Security.NoInternetAccess:
		// The node agent refuses it too: an offline run installs exactly
		// the bundle the spec pinned, never what a tag points at today.
		c.add("bundle.digest-required", SevError, "runtime.bundle",
			fmt.Sprintf("bundle %s is referenced by tag; with no-internet-access: true the node installs only a bundle pinned by digest and refuses the run", s.Runtime.Bundle),
			"pin it by digest: "+ref.Name+"@sha256:<digest> (`gpupass bundle push` prints it)")
	case ref.Digest == "":
		c.add("bundle.by-tag", SevInfo, "runtime.bundle",
			fmt.Sprintf("bundle %s is referenced by tag; a tag can be moved to other content", s.Runtime.Bundle),
			"pin it by digest: "+ref.Name+"@sha256:<digest> (`gpupass bundle push` prints it)")
	}
}

// MaxNodes bounds resources.nodes (and a rendezvous's node count).
const MaxNodes = 1024

// divisors lists the node counts that split count evenly, as a fix
// names them ("1, 2, 4 or 8").
func divisors(count int) string {
	var ds []string
	for d := 1; d <= count && d <= MaxNodes; d++ {
		if count%d == 0 {
			ds = append(ds, strconv.Itoa(d))
		}
	}
	if len(ds) > 8 {
		ds = append(ds[:7], "…")
	}
	if len(ds) == 1 {
		return ds[0]
	}
	return strings.Join(ds[:len(ds)-1], ", ") + " or " + ds[len(ds)-1]
}

var storageTypes = []string{"standard", "high-iops-nvme", "ultra-nvme"}

func (c *checker) resources() {
	r := &c.d.Spec.Resources
	if !c.d.Has("resources") {
		return
	}
	if r.Accelerator == "" && !c.d.Invalid("resources.accelerator") {
		c.add("spec.required", SevError, "resources.accelerator", "resources.accelerator is required",
			"add `accelerator: h100-sxm5` (one of: "+strings.Join(tbl().acceleratorNames(), ", ")+")")
	} else if a, ok := tbl().accelerator(r.Accelerator); r.Accelerator == "" {
		// wrong type, already reported
	} else if !ok {
		msg := fmt.Sprintf("unknown accelerator class %q", clip(r.Accelerator))
		msg += didYouMean(suggest(r.Accelerator, tbl().acceleratorNames()))
		c.add("resources.accelerator", SevError, "resources.accelerator", msg,
			"use one of: "+strings.Join(tbl().acceleratorNames(), ", "))
	} else if c.cudaMM != "" && mustVersion(c.cudaMM).Compare(mustVersion(a.MinCUDA)) < 0 {
		c.add("resources.accelerator-cuda", SevError, "resources.accelerator",
			fmt.Sprintf("%s (%s) needs CUDA %s or newer; runtime.cuda is %s", a.Name, a.Arch, a.MinCUDA, c.cudaMM),
			fmt.Sprintf("use CUDA %s or newer, or another accelerator class", a.MinCUDA))
	}
	if c.d.Has("resources.count") && r.Count < 1 {
		c.add("resources.count", SevError, "resources.count",
			fmt.Sprintf("resources.count is %d; it must be at least 1", r.Count), "write the number of accelerators, e.g. 8")
	}
	if c.d.Has("resources.nodes") && !c.d.Invalid("resources.nodes") {
		switch {
		case r.Nodes < 1 || r.Nodes > MaxNodes:
			c.add("resources.nodes", SevError, "resources.nodes",
				fmt.Sprintf("resources.nodes is %d; it must be 1 to %d", r.Nodes, MaxNodes),
				"write how many nodes the run's resources.count GPUs are spread over, e.g. 2, or leave nodes out to let the broker choose the fewest")
		case r.Count >= 1 && r.Count%r.Nodes != 0:
			c.add("resources.nodes", SevError, "resources.nodes",
				fmt.Sprintf("resources.count %d is not divisible by resources.nodes %d: every node of a run takes the same number of GPUs", r.Count, r.Nodes),
				fmt.Sprintf("resources.count is the total over all nodes: make it a multiple of %d (e.g. %d), or set nodes to one of %s", r.Nodes, (r.Count+r.Nodes-1)/r.Nodes*r.Nodes, divisors(r.Count)))
		}
	}
	if c.d.Has("resources.storage") {
		if r.Storage.Type == "" && !c.d.Invalid("resources.storage.type") {
			c.add("spec.required", SevError, "resources.storage.type", "resources.storage.type is required",
				"add `type: standard` (or high-iops-nvme, ultra-nvme)")
		} else if !slices.Contains(storageTypes, r.Storage.Type) {
			msg := fmt.Sprintf("unknown storage type %q", clip(r.Storage.Type))
			msg += didYouMean(suggest(r.Storage.Type, storageTypes))
			c.add("resources.storage-type", SevError, "resources.storage.type", msg, "use one of: "+strings.Join(storageTypes, ", "))
		}
		if c.d.Has("resources.storage.size_gb") && r.Storage.SizeGB <= 0 {
			c.add("resources.size", SevError, "resources.storage.size_gb",
				fmt.Sprintf("resources.storage.size_gb is %d; it must be positive", r.Storage.SizeGB), "write the size in GB, e.g. 500")
		}
	}
	for _, f := range []struct {
		path string
		v    float64
	}{
		{"resources.network.bandwidth_gbps", r.Network.BandwidthGbps},
		{"resources.network.latency_tolerance_ms", r.Network.LatencyToleranceMS},
	} {
		if c.d.Has(f.path) && f.v <= 0 {
			c.add("resources.size", SevError, f.path,
				fmt.Sprintf("%s is %g; it must be positive", f.path, f.v), "write a positive number")
		}
	}
}
