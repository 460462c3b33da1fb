package gpupass

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/probe/nvmlprobe"
	"github.com/gpupass/gpupass/internal/spec"
)

// LocalMismatch is one difference between the spec and this machine.
type LocalMismatch struct {
	Field    string `json:"field"` // spec path: runtime.cuda, runtime.packages.flash-attn
	What     string `json:"what"`  // "CUDA version"
	Expected string `json:"expected"`
	Got      string `json:"got"`
}

// Line is the one-line text form.
func (m LocalMismatch) Line() string {
	return fmt.Sprintf("Mismatch in %s: expected %s, got %s", m.What, m.Expected, m.Got)
}

// LocalResult is what `validate --local` measured and found.
type LocalResult struct {
	Python             string          `json:"python"`
	Measured           localMeasured   `json:"measured"`
	Mismatches         []LocalMismatch `json:"mismatches"`
	SpecFingerprint    string          `json:"spec_fingerprint"`
	RuntimeFingerprint string          `json:"runtime_fingerprint"`
	Notes              []string        `json:"notes,omitempty"`
}

// localMeasured is the measured runtime (suite.MeasuredRuntime, as the
// node's report has it) and the GPU count.
type localMeasured struct {
	localRuntime
	GPUs int `json:"gpus"`
}

// localRuntime is conformance.Runtime with every key always present; the
// conversion from it compiles only while the two have the same fields.
type localRuntime struct {
	NvidiaDriver  string            `json:"nvidia-driver"`
	CUDADriverAPI string            `json:"cuda-driver-api"`
	CUDA          string            `json:"cuda"`
	Python        string            `json:"python"`
	PyTorch       string            `json:"pytorch"`
	TorchCUDA     string            `json:"torch-cuda"`
	CuDNN         string            `json:"cudnn"`
	Packages      map[string]string `json:"packages"`
	FIPSEnabled   bool              `json:"fips-enabled"`
}

// localGPUProbe reads the GPUs for --local: NVML, or a message saying
// why it is not available.
var localGPUProbe = nvmlprobe.Default

// localCheck compares this machine's runtime with the spec: NVML for the
// driver, nvcc for the toolkit, the --python interpreter for Python,
// torch and the declared packages, and FIPS mode when the spec asks for it.
func localCheck(ctx context.Context, o *ValidateOptions, s *spec.Spec) (*LocalResult, error) {
	exp := suite.FromSpec(s)
	ss := suite.New(localGPUProbe(), probe.NVCC{}, probe.Python{Exe: o.Python, Packages: exp.PackageNames()}, probe.FIPS{})
	res, err := ss.Run(ctx, exp)
	if err != nil {
		return nil, fmt.Errorf("probing the local runtime: %w", err)
	}
	return compareLocal(&res.Facts, s, o.Python)
}

// WriteText is the local check for people: one line per difference, the
// notes, and a verdict.
func (lr *LocalResult) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, m := range lr.Mismatches {
		b.WriteString(m.Line() + "\n")
	}
	for _, n := range lr.Notes {
		b.WriteString("Note: " + n + "\n")
	}
	if len(lr.Mismatches) == 0 {
		fmt.Fprintf(&b, "Local runtime matches the spec (runtime fingerprint %s)\n", lr.RuntimeFingerprint)
	} else {
		fmt.Fprintf(&b, "%d mismatch(es) between the spec and this machine (python: %s)\n", len(lr.Mismatches), lr.Python)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("writing local check: %w", err)
	}
	return nil
}

func compareLocal(f *probe.Facts, s *spec.Spec, python string) (*LocalResult, error) {
	r := s.Runtime
	measured := suite.MeasuredRuntime(f)
	lr := &LocalResult{
		Python:     f.Python.Executable,
		Measured:   localMeasured{localRuntime: localRuntime(measured), GPUs: len(f.GPU.GPUs)},
		Mismatches: []LocalMismatch{},
	}
	if lr.Python == "" {
		lr.Python = python
	}
	add := func(field, what, expected, got string) {
		if expected == "" || expected == got {
			return
		}
		if got == "" {
			got = "not found"
		}
		lr.Mismatches = append(lr.Mismatches, LocalMismatch{Field: field, What: what, Expected: expected, Got: got})
	}
	for _, d := range conformance.DeclaredVersions(s, &measured) {
		if !d.Met() {
			add(d.Field, d.What, d.Expected, d.Measured)
		}
	}
	if r.CUDA != "" && f.Python.TorchCUDA != "" {
		// torch built for another CUDA loads, then fails in JIT-built
		// kernels: say so even when the version strings look right.
		add("runtime.pytorch", "PyTorch CUDA build", majorMinor(r.CUDA), majorMinor(f.Python.TorchCUDA))
	}
	pins := suite.PinnedPackages(s)
	names := make([]string, 0, len(pins))
	for n := range pins {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		want, got := pins[n], f.Python.Packages[n]
		if want == "" {
			continue // not pinned with ==: not checked, as the agent does
		}
		switch {
		case got == "" && f.Python.Found:
			got = "not installed"
		case got != "":
			// The agent's rule, not a string compare: ==2.4.0 is met by
			// 2.4.0+cu121, ==1.26 by 1.26.0.
			match, err := spec.PinMatches(want, got)
			if err == nil && match {
				continue
			}
			if err != nil {
				got += " (" + err.Error() + ")"
			}
		}
		add("runtime.packages."+n, "package "+n, want, got)
	}
	if s.Security.FIPSCompliant && !f.FIPS.Enabled {
		add("security.fips-compliant", "FIPS mode", "enabled", "disabled")
	}
	for _, n := range []struct{ what, reason string }{
		{"", f.GPU.Reason}, {"nvcc ", f.NVCC.Reason}, {"python ", f.Python.Reason}, {"torch ", f.Python.TorchReason},
	} {
		if n.reason != "" {
			lr.Notes = append(lr.Notes, n.what+n.reason)
		}
	}
	var err error
	if lr.SpecFingerprint, err = spec.Fingerprint(s); err != nil {
		return nil, err
	}
	if lr.RuntimeFingerprint, err = suite.RuntimeFingerprint(f, s); err != nil {
		return nil, err
	}
	return lr, nil
}

// majorMinor returns "12.1" of "12.1.105".
func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}
