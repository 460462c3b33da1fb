package spec

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// The OCI distribution reference grammar (distribution/reference), written
// out here because spec may not import network code.
var (
	ociDomainPart = `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
	ociDomain     = `(?:` + ociDomainPart + `(?:\.` + ociDomainPart + `)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?`
	ociPathPart   = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
	ociName       = `(?:` + ociDomain + `/)?` + ociPathPart + `(?:/` + ociPathPart + `)*`
	// The tag's limit of 128 characters is checked after the match: a
	// bounded repeat ({0,127}) compiles to 127 nested alternatives, which
	// cost every gpupass process 1,500 allocations at start-up. Compiled
	// on first use: most commands never parse a reference.
	ociRef = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(` + ociName + `)(?::([\w][\w.-]*))?(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-zA-Z=_-]+))?$`)
	})
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
	m := ociRef().FindStringSubmatch(s)
	if m == nil || len(m[2]) > maxTagLen {
		return OCIRef{}, fmt.Errorf("%q is not an OCI reference (registry/repository:tag or registry/repository@sha256:<64 hex>; repository names are lowercase)", s)
	}
	r := OCIRef{Name: m[1], Tag: m[2], Digest: m[3]}
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
