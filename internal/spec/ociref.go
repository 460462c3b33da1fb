package spec

import (
	"fmt"
	"strings"
)

// maxTagLen is the grammar's limit on a tag.
const maxTagLen = 128

// ociDigestOK says whether d is sha256:<64 lowercase hex> or
// sha512:<128 lowercase hex>.
func ociDigestOK(d string) bool {
	var hex string
	switch {
	case strings.HasPrefix(d, "sha256:"):
		hex = d[len("sha256:"):]
		if len(hex) != 64 {
			return false
		}
	case strings.HasPrefix(d, "sha512:"):
		hex = d[len("sha512:"):]
		if len(hex) != 128 {
			return false
		}
	default:
		return false
	}
	for i := 0; i < len(hex); i++ {
		if c := hex[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// OCIRef is a parsed OCI reference.
type OCIRef struct {
	Name, Tag, Digest string
}

// ParseOCIRef checks the syntax of an OCI reference and requires a tag or a
// digest, so that what a node pulls is never an implied "latest".
func ParseOCIRef(s string) (OCIRef, error) {
	if len(s) > 512 {
		return OCIRef{}, fmt.Errorf("reference longer than 512 characters")
	}
	if strings.Contains(s, "://") {
		return OCIRef{}, fmt.Errorf("%q has a URL scheme; an OCI reference is registry/repository:tag or @sha256:digest", s)
	}
	r, ok := splitOCIRef(s)
	if !ok || len(r.Tag) > maxTagLen {
		return OCIRef{}, fmt.Errorf("%q is not an OCI reference (registry/repository:tag or registry/repository@sha256:<64 hex>; repository names are lowercase)", s)
	}
	if len(r.Name) > 255 {
		return OCIRef{}, fmt.Errorf("repository name longer than 255 characters")
	}
	if r.Digest != "" && !ociDigestOK(r.Digest) {
		return OCIRef{}, fmt.Errorf("digest %q must be sha256:<64 lowercase hex> (or sha512:<128 hex>)", r.Digest)
	}
	if r.Tag == "" && r.Digest == "" {
		return OCIRef{}, fmt.Errorf("%q has neither a tag nor a digest", s)
	}
	return r, nil
}

// splitOCIRef matches the distribution/reference grammar (name, optional
// tag, optional digest), written out by hand rather than as its regexp,
// which was a large part of what `gpupass validate` allocated;
// TestSplitOCIRefMatchesRegexp holds it to that regexp. No part may hold
// an "@", and neither a tag nor a digest's parts a ":" or "/", so the
// parts split at fixed places: the "@", then the last ":" when no "/"
// follows it (a registry's port is always followed by the path).
func splitOCIRef(s string) (OCIRef, bool) {
	var r OCIRef
	if i := strings.IndexByte(s, '@'); i >= 0 {
		s, r.Digest = s[:i], s[i+1:]
		if !ociDigestSyntax(r.Digest) {
			return OCIRef{}, false
		}
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[i:], "/") {
		s, r.Tag = s[:i], s[i+1:]
		if !ociTag(r.Tag) {
			return OCIRef{}, false
		}
	}
	r.Name = s
	if !ociName(s) {
		return OCIRef{}, false
	}
	return r, true
}

// ociName: [domain "/"] path-component ("/" path-component)*, where the
// first of several components may be a domain or a path component.
func ociName(s string) bool {
	parts := strings.Split(s, "/")
	for i, p := range parts {
		if !ociPathComponent(p) && (i > 0 || len(parts) == 1 || !ociDomain(p)) {
			return false
		}
	}
	return true
}

// ociPathComponent: [a-z0-9]+ (([._]|__|-+) [a-z0-9]+)*
func ociPathComponent(s string) bool {
	i := 0
	for {
		start := i
		for i < len(s) && (isDigit(s[i]) || 'a' <= s[i] && s[i] <= 'z') {
			i++
		}
		if i == start {
			return false
		}
		if i == len(s) {
			return true
		}
		switch {
		case strings.HasPrefix(s[i:], "__"):
			i += 2
		case s[i] == '.' || s[i] == '_':
			i++
		case s[i] == '-':
			for i < len(s) && s[i] == '-' {
				i++
			}
		default:
			return false
		}
	}
}

// ociDomain: (label ("." label)* | "[" [a-fA-F0-9:]+ "]") [":" [0-9]+],
// a label being alphanumerics with inner hyphens.
func ociDomain(s string) bool {
	host := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[i:], "]") {
		host = s[:i]
		port := s[i+1:]
		if port == "" || strings.Trim(port, "0123456789") != "" {
			return false
		}
	}
	if strings.HasPrefix(host, "[") {
		inner, ok := strings.CutSuffix(host[1:], "]")
		return ok && inner != "" && strings.Trim(inner, "0123456789abcdefABCDEF:") == ""
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !isAlnum(c) && c != '-' {
				return false
			}
		}
	}
	return true
}

// ociTag: [\w][\w.-]* (the length is checked by the caller).
func ociTag(s string) bool {
	if s == "" || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// ociDigestSyntax: algorithm ":" encoded, the algorithm being
// [A-Za-z][A-Za-z0-9]* ([-_+.] [A-Za-z][A-Za-z0-9]*)* and the encoded part
// [0-9a-zA-Z=_-]+. Which algorithms and lengths are accepted is
// ociDigestOK's.
func ociDigestSyntax(d string) bool {
	alg, enc, ok := strings.Cut(d, ":")
	if !ok || enc == "" || strings.Trim(enc, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ=_-") != "" {
		return false
	}
	atStart := true
	for i := 0; i < len(alg); i++ {
		c := alg[i]
		switch {
		case c == '-' || c == '_' || c == '+' || c == '.':
			if atStart {
				return false
			}
			atStart = true
		case atStart:
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				return false
			}
			atStart = false
		case !isAlnum(c):
			return false
		}
	}
	return !atStart
}
