package wheel

import "github.com/gpupass/gpupass/internal/spec"

// NormalizeName normalises a distribution name (PEP 503). Version pins are
// matched by spec.PinMatches, the one PEP 440 "==" rule.
func NormalizeName(s string) string { return spec.NormalizeName(s) }
