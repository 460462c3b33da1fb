package spec

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

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

// ParseVersion parses a PEP 440 version: the grammar of PEP 440's
// appendix B ("Parsing version strings with regular expressions"),
// case-insensitive, with surrounding whitespace allowed. It is written
// out by hand because compiling and running that regexp was the largest
// part of what `gpupass validate` allocated; TestParseVersionMatchesRegexp
// holds it to the appendix's regexp.
func ParseVersion(s string) (Version, error) {
	if len(s) > maxVersionLen {
		return Version{}, fmt.Errorf("version longer than %d characters", maxVersionLen)
	}
	v, ok, err := parsePEP440(s)
	if err != nil {
		return Version{}, err
	}
	if !ok {
		return Version{}, fmt.Errorf("%q is not a PEP 440 version", s)
	}
	return v, nil
}

// parsePEP440 scans s left to right. The appendix's regexp never needs to
// backtrack into an earlier part: every part after the release starts
// with a separator or a letter, and no label is a prefix of what may
// follow another (so the first label that matches, in the regexp's
// order, is the one a full match uses).
func parsePEP440(s string) (v Version, ok bool, err error) {
	p := pepScanner{s: s}
	v = Version{Post: -1, Dev: -1}
	p.spaces()
	if p.peek() == 'v' || p.peek() == 'V' {
		p.i++
	}
	// The epoch is the first number when "!" follows it.
	start := p.i
	n := p.digits()
	if n == "" {
		return v, false, nil
	}
	if p.peek() == '!' {
		p.i++
		if v.Epoch, err = pepNum(n); err != nil {
			return v, false, err
		}
		start = p.i
		if p.digits() == "" {
			return v, false, nil
		}
	}
	p.i = start
	for {
		part := p.digits()
		if part == "" {
			return v, false, nil
		}
		x, err := pepNum(part)
		if err != nil {
			return v, false, err
		}
		v.Release = append(v.Release, x)
		if p.peek() != '.' || !isDigit(p.at(p.i+1)) {
			break
		}
		p.i++
	}
	// Pre-release: [-_.]? label [-_.]? N?
	if j, label := p.label(p.i, true, "alpha", "a", "beta", "b", "preview", "pre", "c", "rc"); label != "" {
		p.i = j
		switch label {
		case "alpha", "a":
			v.Pre = "a"
		case "beta", "b":
			v.Pre = "b"
		default:
			v.Pre = "rc"
		}
		if v.PreN, err = p.number(); err != nil {
			return v, false, err
		}
	}
	// Post-release: -N, or [-_.]? label [-_.]? N?
	if p.peek() == '-' && isDigit(p.at(p.i+1)) {
		p.i++
		if v.Post, err = pepNum(p.digits()); err != nil {
			return v, false, err
		}
	} else if j, label := p.label(p.i, true, "post", "rev", "r"); label != "" {
		p.i = j
		if v.Post, err = p.number(); err != nil {
			return v, false, err
		}
	}
	// Development release: [-_.]? dev [-_.]? N?
	if j, label := p.label(p.i, true, "dev"); label != "" {
		p.i = j
		if v.Dev, err = p.number(); err != nil {
			return v, false, err
		}
	}
	// Local label: + alnum+ ([-_.] alnum+)*
	if p.peek() == '+' {
		p.i++
		start := p.i
		for {
			if p.alnums() == 0 {
				return v, false, nil
			}
			if !isPEPSep(p.peek()) || !isAlnum(p.at(p.i+1)) {
				break
			}
			p.i++
		}
		v.Local = strings.ToLower(strings.NewReplacer("-", ".", "_", ".").Replace(s[start:p.i]))
	}
	p.spaces()
	if p.i != len(s) {
		return v, false, nil
	}
	return v, true, nil
}

// pepScanner is a position in a version string.
type pepScanner struct {
	s string
	i int
}

// at is the byte at i, or 0 past the end.
func (p *pepScanner) at(i int) byte {
	if i < len(p.s) {
		return p.s[i]
	}
	return 0
}

func (p *pepScanner) peek() byte { return p.at(p.i) }

// spaces skips the regexp's \s: ASCII tab, newline, form feed, carriage
// return and space.
func (p *pepScanner) spaces() {
	for {
		switch p.peek() {
		case '\t', '\n', '\f', '\r', ' ':
			p.i++
		default:
			return
		}
	}
}

func (p *pepScanner) digits() string {
	start := p.i
	for isDigit(p.peek()) {
		p.i++
	}
	return p.s[start:p.i]
}

func (p *pepScanner) alnums() int {
	start := p.i
	for isAlnum(p.peek()) {
		p.i++
	}
	return p.i - start
}

// label matches an optional separator and the first of labels (case
// folded) at i, returning the position after it, or "" for none.
func (p *pepScanner) label(i int, sep bool, labels ...string) (int, string) {
	if sep && isPEPSep(p.at(i)) {
		if j, l := p.label(i+1, false, labels...); l != "" {
			return j, l
		}
	}
	for _, l := range labels {
		if len(p.s)-i >= len(l) && strings.EqualFold(p.s[i:i+len(l)], l) {
			return i + len(l), l
		}
	}
	return i, ""
}

// number reads a label's number: [-_.]? N?, 0 when absent. Like the
// regexp it takes a separator even when no digits follow ("1.0a."):
// what may come next either has an optional separator of its own or, for
// the post-release "-N", starts with digits this would have taken.
func (p *pepScanner) number() (int, error) {
	if isPEPSep(p.peek()) {
		p.i++
	}
	return pepNum(p.digits())
}

func pepNum(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("version component %q is too large", s)
	}
	return n, nil
}

func isDigit(c byte) bool  { return '0' <= c && c <= '9' }
func isAlnum(c byte) bool  { return isDigit(c) || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isPEPSep(c byte) bool { return c == '-' || c == '_' || c == '.' }

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

// NormalizeName returns a package name normalised per PEP 503
// ("Flash_Attn" -> "flash-attn"): each run of "-", "_" and "." becomes one
// "-", and letters are lowercased.
func NormalizeName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	for i := 0; i < len(name); i++ {
		if isPEPSep(name[i]) {
			if i == 0 || !isPEPSep(name[i-1]) {
				b.WriteByte('-')
			}
			continue
		}
		b.WriteByte(name[i])
	}
	return strings.ToLower(b.String())
}

// pep508Name says whether s is a valid PEP 508 project name: ASCII
// letters and digits, with ".", "_" and "-" inside. (It was a regexp,
// compiled by every gpupass process at start-up; a case-insensitive one,
// which also let the Kelvin sign and the long s stand for k and s.)
func pep508Name(s string) bool {
	if s == "" || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && !isPEPSep(s[i]) {
			return false
		}
	}
	return true
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
	if !pep508Name(r.Name) {
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
			if !pep508Name(e) {
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
