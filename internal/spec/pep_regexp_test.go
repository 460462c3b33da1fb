package spec

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// pep440Regexp is PEP 440's appendix B regexp, anchored and
// case-insensitive: the grammar ParseVersion is written out from.
var pep440Regexp = regexp.MustCompile(`(?i)^\s*v?` +
	`(?:(?P<epoch>[0-9]+)!)?` +
	`(?P<release>[0-9]+(?:\.[0-9]+)*)` +
	`(?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?` +
	`(?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?` +
	`(?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?` +
	`(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$`)

// versionByRegexp is what ParseVersion returned when it ran the regexp:
// the oracle the hand-written parser is held to.
func versionByRegexp(s string) (Version, bool) {
	m := pep440Regexp.FindStringSubmatch(s)
	if m == nil {
		return Version{}, false
	}
	g := func(name string) string { return m[pep440Regexp.SubexpIndex(name)] }
	num := func(s string) int {
		n, err := pepNum(s)
		if err != nil {
			return -2 // compared as a value: both must refuse it
		}
		return n
	}
	v := Version{Post: -1, Dev: -1, Epoch: num(g("epoch"))}
	for _, part := range strings.Split(g("release"), ".") {
		v.Release = append(v.Release, num(part))
	}
	if g("pre") != "" {
		switch strings.ToLower(g("pre_l")) {
		case "a", "alpha":
			v.Pre = "a"
		case "b", "beta":
			v.Pre = "b"
		default:
			v.Pre = "rc"
		}
		v.PreN = num(g("pre_n"))
	}
	if g("post") != "" {
		n := g("post_n1")
		if n == "" {
			n = g("post_n2")
		}
		v.Post = num(n)
	}
	if g("dev") != "" {
		v.Dev = num(g("dev_n"))
	}
	if l := g("local"); l != "" {
		v.Local = strings.ToLower(strings.NewReplacer("-", ".", "_", ".").Replace(l))
	}
	return v, true
}

// checkAgainstRegexp fails t when ParseVersion and the regexp disagree on s.
func checkAgainstRegexp(t *testing.T, s string) {
	t.Helper()
	if len(s) > maxVersionLen {
		return
	}
	want, wantOK := versionByRegexp(s)
	got, err := ParseVersion(s)
	tooLarge := func(v Version) bool {
		for _, n := range append([]int{v.Epoch, v.PreN, v.Post, v.Dev}, v.Release...) {
			if n == -2 {
				return true
			}
		}
		return false
	}
	switch {
	case wantOK && tooLarge(want):
		if err == nil || !strings.Contains(err.Error(), "too large") {
			t.Errorf("ParseVersion(%q) = %v, %v; the regexp matches with a number too large", s, got, err)
		}
	case wantOK != (err == nil):
		t.Errorf("ParseVersion(%q) error = %v; the regexp matches: %v", s, err, wantOK)
	case wantOK:
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ParseVersion(%q) (-regexp +parser):\n%s", s, diff)
		}
	}
}

// TestParseVersionMatchesRegexp holds the hand-written parser to the
// appendix's regexp: the edge cases of each part, then random strings
// made of the grammar's own pieces, where the two could part ways.
func TestParseVersionMatchesRegexp(t *testing.T) {
	t.Parallel()
	cases := []string{
		"2.1.0+cu121", "2.1.0+CU121", "v1.0", "V1.0", "vv1.0", "1.0-alpha.1", "1.0.0RC2", "1.0-1", "1.0.post",
		"1.0_dev3", "1!2.0", "1!", "!1", "0.0.23.post1", "2.1.0+local_tag-x", "01.002.0003", "latest", "1.0+",
		"", " ", "99999999999999999999999.0", "1.0a.", "1.0a-", "1.0a-1", "1.0a--1", "1.0a.-1", "1.0a.-post1",
		"1.0.post-", "1.0dev", "1.0.dev.", "1.0-dev", "1.0-r1", "1.0r", "1.0rev2", "1.0rc", "1.0c1", "1.0preview3",
		"1.0pre", "1.0alphadev", "1.0adev", "1.0betadev", "1.0.", "1.", ".1", "1..0", "1.0+a..b", "1.0+a-", "1.0+-a",
		" \t1.0\n", "1.0\v", "1.0 +a", "1.0+a.B_c-D", "1.0a1.post1.dev1+l.1", "1.0-1-1", "1.0-1.post1", "1.0post-1",
		"1.0-post", "1.0_post_2", "1.0a1b1", "1.0rc1rc1", "1.0.dev1.dev1", "1!2!3", "1.0-", "1.0_", "1.0a1-",
		"1.0+9999999999999999999999", "1.0a99999999999999999999", "1.0.post99999999999999999999",
		"99999999999999999999!1.0", "1.0.dev99999999999999999999",
	}
	for _, s := range cases {
		checkAgainstRegexp(t, s)
	}
	pieces := []string{"0", "1", "12", "007", ".", "-", "_", "!", "+", " ", "\t", "v", "V", "a", "A", "alpha",
		"b", "beta", "c", "rc", "RC", "pre", "preview", "post", "Post", "rev", "r", "dev", "DEV", "l", "x", "9"}
	rng := rand.New(rand.NewPCG(21, 440))
	for range 50000 {
		var b strings.Builder
		// Mostly well-formed starts, so that the later parts are reached.
		if rng.IntN(4) > 0 {
			b.WriteString([]string{"1", "1.0", "2!3.4", "v1.2.3", " 0.1"}[rng.IntN(5)])
		}
		for range rng.IntN(7) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		checkAgainstRegexp(t, b.String())
	}
}

func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"2.1.0+cu121", "1.0a.-post1", "1!2.0rc1.post2.dev3+x.y"} {
		f.Add(s)
	}
	f.Fuzz(checkAgainstRegexp)
}

// TestSmallMatchersMatchRegexps holds the hand-written matchers of the
// rules and of PEP 503/508 names to the regexps they replace, over edge
// cases and random strings of their alphabet. The one difference is
// meant: the name regexp was case-insensitive, so Unicode's Kelvin sign
// and long s passed for k and s; pep508Name takes ASCII only.
func TestSmallMatchersMatchRegexps(t *testing.T) {
	t.Parallel()
	type matcher struct {
		name string
		re   *regexp.Regexp
		fn   func(string) []string
	}
	bools := func(f func(string) bool) func(string) []string {
		return func(s string) []string {
			if f(s) {
				return []string{s}
			}
			return nil
		}
	}
	matchers := []matcher{
		{"cudaExact", regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)$`), cudaExact},
		{"cudaPartial", regexp.MustCompile(`^(\d+)(?:\.(\d+))?$`), cudaPartial},
		{"driver", regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?$`), driverMatch},
		{"python", regexp.MustCompile(`^3\.(\d+)(?:\.(\d+))?$`), pythonMatch},
		{"cudaTag", regexp.MustCompile(`^cu\d+$`), bools(isCUDATag)},
		{"pep508Name", regexp.MustCompile(`(?i)^([a-z0-9]|[a-z0-9][a-z0-9._-]*[a-z0-9])$`), bools(pep508Name)},
	}
	sep := regexp.MustCompile(`[-_.]+`)
	cases := []string{"", ".", "1", "12.1", "12.1.105", "12.1.", ".12.1", "12..1", "1.2.3.4", "3", "3.10", "3.10.12",
		"4.10", "3.x", "03.1", "cu", "cu121", "cu12a", "Cu121", "a", "A", "a-", "-a", "a.b", "a..b", "Flash_Attn",
		"flash--attn", "x__y.-z", "１２", "12\n", " 12.1.1"}
	pieces := []string{"0", "1", "3", "12", ".", "..", "-", "_", "a", "Z", "cu", "x", " "}
	rng := rand.New(rand.NewPCG(21, 508))
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(6) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		cases = append(cases, b.String())
	}
	for _, s := range cases {
		for _, m := range matchers {
			want := m.re.FindStringSubmatch(s)
			if m.name == "cudaTag" || m.name == "pep508Name" {
				want = want[:min(len(want), 1)]
				if len(want) == 0 {
					want = nil
				}
			}
			if got := m.fn(s); !slices.Equal(got, want) {
				t.Errorf("%s(%q) = %q; the regexp: %q", m.name, s, got, want)
			}
		}
		if got, want := NormalizeName(s), strings.ToLower(sep.ReplaceAllString(s, "-")); got != want {
			t.Errorf("NormalizeName(%q) = %q; with the regexp: %q", s, got, want)
		}
	}
	for _, s := range []string{"\u212Aeras", "\u017Fix"} {
		if pep508Name(s) {
			t.Errorf("pep508Name(%q) = true; a project name is ASCII", s)
		}
	}
}
