package conformance

import (
	"strings"

	"github.com/gpupass/gpupass/internal/spec"
)

// Declared is one version a spec declares exactly, beside the one a node
// measured.
type Declared struct {
	Field    string // the spec's key: "runtime.cuda"
	What     string // in words: "CUDA version"
	Expected string // as declared, trimmed; "" when the spec leaves it open
	Measured string
}

// DeclaredVersions pairs the versions sp declares exactly with rt's: the
// one list of what a node's measured runtime must equal, which the
// broker's matching and validate --local both compare (the node's suite
// checks each version too, with its own rules for the CUDA driver API and
// torch's build).
func DeclaredVersions(sp *spec.Spec, rt *Runtime) []Declared {
	r := &sp.Runtime
	return []Declared{
		{"runtime.nvidia-driver", "NVIDIA driver version", strings.TrimSpace(r.NvidiaDriver), rt.NvidiaDriver},
		{"runtime.cuda", "CUDA version", strings.TrimSpace(r.CUDA), rt.CUDA},
		{"runtime.python", "Python version", strings.TrimSpace(r.Python), rt.Python},
		{"runtime.pytorch", "PyTorch version", strings.TrimSpace(r.PyTorch), rt.PyTorch},
	}
}

// Met reports whether the measured version meets the declared one: the
// spec leaves it open, or the two are equal (spaces aside).
func (d Declared) Met() bool {
	return d.Expected == "" || d.Expected == strings.TrimSpace(d.Measured)
}
