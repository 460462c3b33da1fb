package spec

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Canonical returns the canonical JSON of the parts of s that define the
// environment: runtime and security. The encoding follows RFC 8785 (JCS):
// keys sorted, no insignificant whitespace, minimal string escaping.
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
		if n, err := ParseSize(r.CUDAMallocAsyncReleaseThreshold); err == nil {
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
	var b bytes.Buffer
	if err := writeJCS(&b, doc); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
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

// writeJCS encodes the value kinds Canonical builds, per RFC 8785. Keys
// are ASCII, so byte order equals the UTF-16 order the RFC asks for.
func writeJCS(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJCSString(b, k)
			b.WriteByte(':')
			if err := writeJCS(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJCS(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case string:
		if !utf8.ValidString(v) {
			return fmt.Errorf("canonical JSON: invalid UTF-8 in %q", v)
		}
		writeJCSString(b, v)
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	default:
		return fmt.Errorf("canonical JSON: unsupported type %T", v)
	}
	return nil
}

func writeJCSString(b *bytes.Buffer, s string) {
	const hexdigits = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hexdigits[r>>4])
				b.WriteByte(hexdigits[r&0xf])
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
