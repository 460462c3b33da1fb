package spec

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/gpupass/gpupass/internal/canonjson"
)

// Canonical returns the canonical JSON of the parts of s that define the
// environment: runtime and security. The encoding is RFC 8785 (JCS), by
// internal/canonjson, the one canonical encoder: keys sorted, no
// insignificant whitespace, minimal string escaping.
// Values are normalised so that equivalent specs encode the same:
//   - pytorch and package versions in PEP 440 normal form, package names
//     per PEP 503, extras sorted, packages sorted;
//   - environment markers spelt one way (CanonicalMarker: spacing and
//     quotes), their terms and order kept as written;
//   - the malloc release threshold in bytes ("2GB" and "2000MB" agree);
//   - cuda, nvidia-driver and python as written (trimmed): they are
//     already exact numbers.
//
// Left out on purpose: name and description (labels), resources (they are
// placement constraints; an A100 may stand in for an H100 and the job is
// the same), and runtime.bundle (where the wheels come from, not what is
// installed; the bundle itself is annotated with this fingerprint, so
// including its digest would be circular).
//
// The broker, the agents and audits call this: changing what goes in, or
// how, changes every fingerprint. Treat it as a wire format.
func Canonical(s *Spec) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("canonical form of a nil spec")
	}
	r := s.Runtime
	pkgs := make([]any, 0, len(r.Packages))
	var sorted []string
	for _, p := range r.Packages {
		if req, err := ParseRequirement(p); err == nil {
			sorted = append(sorted, req.Canonical)
		} else {
			sorted = append(sorted, p)
		}
	}
	slices.Sort(sorted)
	for _, p := range sorted {
		pkgs = append(pkgs, p)
	}
	runtime := map[string]any{
		"cuda":              r.CUDA,
		"nvidia-driver":     r.NvidiaDriver,
		"python":            r.Python,
		"pytorch":           normVersion(r.PyTorch),
		"cuda-malloc-async": r.CUDAMallocAsync,
		"packages":          pkgs,
	}
	if r.CUDAMallocAsyncReleaseThreshold != "" {
		// Beyond 2^53 bytes (8 PiB) a size is no longer an exact RFC 8785
		// number: such a threshold is kept as written.
		if n, err := ParseSize(r.CUDAMallocAsyncReleaseThreshold); err == nil && n <= 1<<53 {
			runtime["cuda-malloc-async-release-threshold"] = n
		} else {
			runtime["cuda-malloc-async-release-threshold"] = r.CUDAMallocAsyncReleaseThreshold
		}
	}
	doc := map[string]any{
		"runtime": runtime,
		"security": map[string]any{
			"fips-compliant":     s.Security.FIPSCompliant,
			"no-internet-access": s.Security.NoInternetAccess,
		},
	}
	// encoding/json would replace invalid UTF-8 with U+FFFD, so two
	// different specs could share a fingerprint: refuse them instead.
	for _, v := range append([]string{r.CUDA, r.NvidiaDriver, r.Python, r.PyTorch, r.CUDAMallocAsyncReleaseThreshold}, r.Packages...) {
		if !utf8.ValidString(v) {
			return nil, fmt.Errorf("canonical JSON: invalid UTF-8 in %q", v)
		}
	}
	return canonjson.Marshal(doc)
}

// Fingerprint returns "sha256:<hex>" of Canonical(s).
func Fingerprint(s *Spec) (string, error) {
	c, err := Canonical(s)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

func normVersion(s string) string {
	if v, err := ParseVersion(s); err == nil {
		return v.String()
	}
	return s
}
