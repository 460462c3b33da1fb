package wheel

import (
	"strings"

	"github.com/gpupass/gpupass/internal/spec"
)

// NormalizeName normalises a distribution name (PEP 503).
func NormalizeName(s string) string { return spec.NormalizeName(s) }

// VersionsEqual reports whether a wheel's version satisfies an exact pin
// (PEP 440 `==` without wildcards): public versions compare as PEP 440
// orders them (2.1 == 2.1.0), and a local label (+cu121) must match when
// the pin names one; a pin without one accepts any, as pip does.
func VersionsEqual(pin, have string) bool {
	p, err1 := spec.ParseVersion(pin)
	h, err2 := spec.ParseVersion(have)
	if err1 != nil || err2 != nil {
		return strings.EqualFold(strings.TrimSpace(pin), strings.TrimSpace(have))
	}
	if p.Compare(h) != 0 {
		return false
	}
	return p.Local == "" || p.Local == h.Local
}
