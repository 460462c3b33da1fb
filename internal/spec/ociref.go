package spec

import (
	"fmt"
	"regexp"
	"strings"
)

// The OCI distribution reference grammar (distribution/reference), written
// out here because spec may not import network code.
var (
	ociDomainPart = `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
	ociDomain     = `(?:` + ociDomainPart + `(?:\.` + ociDomainPart + `)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?`
	ociPathPart   = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
	ociName       = `(?:` + ociDomain + `/)?` + ociPathPart + `(?:/` + ociPathPart + `)*`
	ociRef        = regexp.MustCompile(`^(` + ociName + `)(?::([\w][\w.-]{0,127}))?(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-zA-Z=_-]+))?$`)
	ociDigest     = regexp.MustCompile(`^(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})$`)
)

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
	m := ociRef.FindStringSubmatch(s)
	if m == nil {
		return OCIRef{}, fmt.Errorf("%q is not an OCI reference (registry/repository:tag or registry/repository@sha256:<64 hex>; repository names are lowercase)", s)
	}
	r := OCIRef{Name: m[1], Tag: m[2], Digest: m[3]}
	if len(r.Name) > 255 {
		return OCIRef{}, fmt.Errorf("repository name longer than 255 characters")
	}
	if r.Digest != "" && !ociDigest.MatchString(r.Digest) {
		return OCIRef{}, fmt.Errorf("digest %q must be sha256:<64 lowercase hex> (or sha512:<128 hex>)", r.Digest)
	}
	if r.Tag == "" && r.Digest == "" {
		return OCIRef{}, fmt.Errorf("%q has neither a tag nor a digest", s)
	}
	return r, nil
}
