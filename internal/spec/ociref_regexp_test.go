package spec

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// ociRefRegexp is the distribution/reference grammar as a regexp (the tag
// length is checked apart): the oracle splitOCIRef is held to.
var ociRefRegexp = func() *regexp.Regexp {
	domainPart := `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
	domain := `(?:` + domainPart + `(?:\.` + domainPart + `)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?`
	pathPart := `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
	name := `(?:` + domain + `/)?` + pathPart + `(?:/` + pathPart + `)*`
	return regexp.MustCompile(`^(` + name + `)(?::([\w][\w.-]*))?(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-zA-Z=_-]+))?$`)
}()

func checkOCIAgainstRegexp(t *testing.T, s string) {
	t.Helper()
	m := ociRefRegexp.FindStringSubmatch(s)
	got, ok := splitOCIRef(s)
	switch {
	case (m != nil) != ok:
		t.Errorf("splitOCIRef(%q) ok = %v; the regexp matches: %v", s, ok, m != nil)
	case ok && (got != OCIRef{Name: m[1], Tag: m[2], Digest: m[3]}):
		t.Errorf("splitOCIRef(%q) = %+v; the regexp: name %q tag %q digest %q", s, got, m[1], m[2], m[3])
	}
}

// TestSplitOCIRefMatchesRegexp holds the hand-written reference parser to
// the grammar's regexp: edge cases of each part, then random references
// made of the grammar's pieces.
func TestSplitOCIRefMatchesRegexp(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("0a", 32)
	cases := []string{
		"127.0.0.1:5000/team/wheels:v1", "localhost:5000/wheels@" + digest, "reg.example/a/b:v1@" + digest,
		"[::1]:5000/w:t", "[::1]/w", "[::1]", "[]/w", "[:]/w", "[g]/w", "[::1]x/w", "team/wheels", "Team/Wheels:v1",
		"https://reg.example/w:v1", "reg.example/w@sha256:abc", "reg.example/w:", "reg.example/w@", "", "w", "w:t",
		"w:5000", "localhost:5000", "localhost:5000/w", "localhost:/w", "localhost:x/w", "a:b:5000/w",
		"-a.example/w", "a-.example/w", "a..example/w", ".a/w", "a./w", "A.Example/w", "Reg/w", "reg/W",
		"a__b/c", "a___b", "a_.b", "a--b", "a-", "-a", "a.b.c", "a/b//c", "a/", "/a", "w:.t", "w:-t", "w:_t",
		"w:t@" + digest, "w@@" + digest, "w@sha256:x@" + digest, "w@1sha:x", "w@sha+256:x", "w@sha+:x",
		"w@sha:", "w@:x", "w@s-h_a+b.c:x=y", "w@sha256:a/b", "w:t/x", "w/x:t/y", "a:1/b:2/c", "Ex.com:80/a",
	}
	for _, s := range cases {
		checkOCIAgainstRegexp(t, s)
	}
	pieces := []string{"a", "b", "Z", "0", "9", ".", "_", "__", "-", "--", "/", ":", "@", "[", "]", "::1",
		"localhost", "reg.example", "5000", "sha256", "+", "=", "v1", "x"}
	rng := rand.New(rand.NewPCG(21, 3))
	for range 50000 {
		var b strings.Builder
		for range 1 + rng.IntN(8) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		checkOCIAgainstRegexp(t, b.String())
	}
}

func FuzzSplitOCIRef(f *testing.F) {
	for _, s := range []string{"[::1]:5000/w:t", "reg.example/a/b:v1@sha256:00", "a__b-c/d"} {
		f.Add(s)
	}
	f.Fuzz(checkOCIAgainstRegexp)
}
