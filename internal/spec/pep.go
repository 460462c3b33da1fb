package spec

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// pep440 is the version grammar of PEP 440, appendix B ("Parsing version
// strings with regular expressions"), anchored and case-insensitive.
// Compiled on first use, not at every process start.
var pep440 = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)^\s*v?` +
		`(?:(?P<epoch>[0-9]+)!)?` +
		`(?P<release>[0-9]+(?:\.[0-9]+)*)` +
		`(?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?` +
		`(?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?` +
		`(?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?` +
		`(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$`)
})

// Version is a parsed PEP 440 version.
type Version struct {
	Epoch   int
	Release []int
	Pre     string // "a", "b", "rc" or ""
	PreN    int
	Post    int // -1 when absent
	Dev     int // -1 when absent
	Local   string
}

// maxVersionLen bounds what we try to parse: real versions are short, and
// a bound keeps a hostile spec from making the regexp work hard.
const maxVersionLen = 128

// ParseVersion parses a PEP 440 version.
func ParseVersion(s string) (Version, error) {
	if len(s) > maxVersionLen {
		return Version{}, fmt.Errorf("version longer than %d characters", maxVersionLen)
	}
	m := pep440().FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("%q is not a PEP 440 version", s)
	}
	g := func(name string) string { return m[pep440().SubexpIndex(name)] }
	num := func(s string) (int, error) {
		if s == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("version component %q is too large", s)
		}
		return n, nil
	}
	v := Version{Post: -1, Dev: -1}
	var err error
	if v.Epoch, err = num(g("epoch")); err != nil {
		return Version{}, err
	}
	for _, part := range strings.Split(g("release"), ".") {
		n, err := num(part)
		if err != nil {
			return Version{}, err
		}
		v.Release = append(v.Release, n)
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
		if v.PreN, err = num(g("pre_n")); err != nil {
			return Version{}, err
		}
	}
	if g("post") != "" {
		n := g("post_n1")
		if n == "" {
			n = g("post_n2")
		}
		if v.Post, err = num(n); err != nil {
			return Version{}, err
		}
	}
	if g("dev") != "" {
		if v.Dev, err = num(g("dev_n")); err != nil {
			return Version{}, err
		}
	}
	if l := g("local"); l != "" {
		v.Local = strings.ToLower(strings.NewReplacer("-", ".", "_", ".").Replace(l))
	}
	return v, nil
}

// Public is the normalised version without its local label.
func (v Version) Public() string {
	var b strings.Builder
	if v.Epoch != 0 {
		fmt.Fprintf(&b, "%d!", v.Epoch)
	}
	for i, n := range v.Release {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strconv.Itoa(n))
	}
	if v.Pre != "" {
		fmt.Fprintf(&b, "%s%d", v.Pre, v.PreN)
	}
	if v.Post >= 0 {
		fmt.Fprintf(&b, ".post%d", v.Post)
	}
	if v.Dev >= 0 {
		fmt.Fprintf(&b, ".dev%d", v.Dev)
	}
	return b.String()
}

// String is the PEP 440 normalised form ("2.1.0+cu121").
func (v Version) String() string {
	if v.Local == "" {
		return v.Public()
	}
	return v.Public() + "+" + v.Local
}

// Compare orders public versions (local labels ignored), following PEP
// 440: dev < pre < final < post, trailing zero release parts ignored.
func (v Version) Compare(w Version) int {
	if c := v.Epoch - w.Epoch; c != 0 {
		return sign(c)
	}
	if c := slices.Compare(trimZeros(v.Release), trimZeros(w.Release)); c != 0 {
		return c
	}
	return slices.Compare(v.phase(), w.phase())
}

// phase ranks the suffixes of one release for Compare.
func (v Version) phase() []int {
	pre := []int{3, 0} // a final release sorts after every pre-release
	switch {
	case v.Pre == "a":
		pre = []int{0, v.PreN}
	case v.Pre == "b":
		pre = []int{1, v.PreN}
	case v.Pre == "rc":
		pre = []int{2, v.PreN}
	case v.Dev >= 0 && v.Post < 0:
		pre = []int{-1, 0} // 1.0.dev1 sorts before 1.0a1
	}
	dev := v.Dev
	if dev < 0 {
		dev = 1 << 30
	}
	return append(pre, v.Post, dev)
}

func trimZeros(r []int) []int {
	for len(r) > 1 && r[len(r)-1] == 0 {
		r = r[:len(r)-1]
	}
	return r
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

// MajorMinor returns "X.Y" of a version's release.
func (v Version) MajorMinor() string {
	if len(v.Release) < 2 {
		return fmt.Sprintf("%d.0", v.Release[0])
	}
	return fmt.Sprintf("%d.%d", v.Release[0], v.Release[1])
}

// mustVersion parses a version from the embedded data tables.
func mustVersion(s string) Version {
	v, err := ParseVersion(s)
	if err != nil {
		panic(fmt.Sprintf("spec data: %v", err))
	}
	return v
}

var (
	pep503Sep  = regexp.MustCompile(`[-_.]+`)
	pep508Name = regexp.MustCompile(`(?i)^([a-z0-9]|[a-z0-9][a-z0-9._-]*[a-z0-9])$`)
)

// NormalizeName returns a package name normalised per PEP 503
// ("Flash_Attn" -> "flash-attn").
func NormalizeName(name string) string {
	return strings.ToLower(pep503Sep.ReplaceAllString(name, "-"))
}

// Requirement is one parsed PEP 508 requirement line of runtime.packages.
type Requirement struct {
	Name      string   // as written
	Extras    []string // normalised, sorted
	Specs     []Specifier
	URL       string // "name @ url" form
	Marker    string // environment marker, whitespace collapsed
	Canonical string // normalised "name[extras]==version; marker"
}

// Specifier is one version clause ("==2.1.0").
type Specifier struct {
	Op      string
	Version string
}

var specOps = []string{"===", "~=", "==", "!=", "<=", ">=", "<", ">"}

// ParseRequirement parses a PEP 508 requirement. It supports the forms a
// pinned environment uses: name, extras, version specifiers (optionally in
// parentheses), "name @ url" and an environment marker.
func ParseRequirement(s string) (Requirement, error) {
	var r Requirement
	s = strings.TrimSpace(s)
	if s == "" {
		return r, fmt.Errorf("empty requirement")
	}
	if len(s) > 1024 {
		return r, fmt.Errorf("requirement longer than 1024 characters")
	}
	if i := strings.IndexByte(s, ';'); i >= 0 {
		if strings.TrimSpace(s[i+1:]) == "" {
			return r, &MarkerError{Msg: "nothing after ';'", Fix: "drop the ';', or write a marker after it, e.g. torch==2.3.1; sys_platform == \"linux\""}
		}
		m, err := CanonicalMarker(s[i+1:])
		if err != nil {
			return r, err
		}
		r.Marker = m
		s = strings.TrimSpace(s[:i])
	}
	end := strings.IndexAny(s, "[(<>=!~@ \t")
	if end < 0 {
		end = len(s)
	}
	r.Name = s[:end]
	if !pep508Name.MatchString(r.Name) {
		return r, fmt.Errorf("%q is not a valid package name", r.Name)
	}
	rest := strings.TrimSpace(s[end:])
	if strings.HasPrefix(rest, "[") {
		j := strings.IndexByte(rest, ']')
		if j < 0 {
			return r, fmt.Errorf("unclosed '[' in extras")
		}
		for _, e := range strings.Split(rest[1:j], ",") {
			e = strings.TrimSpace(e)
			if !pep508Name.MatchString(e) {
				return r, fmt.Errorf("invalid extra %q", e)
			}
			r.Extras = append(r.Extras, NormalizeName(e))
		}
		slices.Sort(r.Extras)
		r.Extras = slices.Compact(r.Extras)
		rest = strings.TrimSpace(rest[j+1:])
	}
	if strings.HasPrefix(rest, "@") {
		r.URL = strings.TrimSpace(rest[1:])
		if r.URL == "" {
			return r, fmt.Errorf("missing URL after '@'")
		}
		rest = ""
	}
	if strings.HasPrefix(rest, "(") {
		if !strings.HasSuffix(rest, ")") {
			return r, fmt.Errorf("unclosed '(' in version specifier")
		}
		rest = strings.TrimSpace(rest[1 : len(rest)-1])
	}
	if rest != "" {
		for _, clause := range strings.Split(rest, ",") {
			clause = strings.TrimSpace(clause)
			op := ""
			for _, o := range specOps {
				if strings.HasPrefix(clause, o) {
					op = o
					break
				}
			}
			if op == "" {
				return r, fmt.Errorf("unexpected %q: expected a version specifier such as ==1.2.3", clause)
			}
			ver := strings.TrimSpace(clause[len(op):])
			if ver == "" {
				return r, fmt.Errorf("missing version after %q", op)
			}
			if op != "===" && !(strings.HasSuffix(ver, ".*") && (op == "==" || op == "!=")) {
				if _, err := ParseVersion(ver); err != nil {
					return r, err
				}
			}
			r.Specs = append(r.Specs, Specifier{Op: op, Version: ver})
		}
	}
	r.Canonical = r.canonical()
	return r, nil
}

// Pinned returns the exact version when the requirement is one "==X"
// clause without a wildcard.
func (r Requirement) Pinned() (Version, bool) {
	if r.URL != "" || len(r.Specs) != 1 || r.Specs[0].Op != "==" || strings.HasSuffix(r.Specs[0].Version, ".*") {
		return Version{}, false
	}
	v, err := ParseVersion(r.Specs[0].Version)
	return v, err == nil
}

func (r Requirement) canonical() string {
	var b strings.Builder
	b.WriteString(NormalizeName(r.Name))
	if len(r.Extras) > 0 {
		b.WriteString("[" + strings.Join(r.Extras, ",") + "]")
	}
	if r.URL != "" {
		b.WriteString(" @ " + r.URL)
	}
	var clauses []string
	for _, s := range r.Specs {
		ver := s.Version
		if v, err := ParseVersion(ver); err == nil && s.Op != "===" {
			ver = v.String()
		}
		clauses = append(clauses, s.Op+ver)
	}
	slices.Sort(clauses)
	b.WriteString(strings.Join(clauses, ","))
	if r.Marker != "" {
		b.WriteString("; " + r.Marker)
	}
	return b.String()
}
