package workdir

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"strings"
)

// IgnoreFiles are read in every directory of a work dir, in this order
// (a later line wins): .gitignore, so what git leaves out of the project
// stays off the nodes too, then .gpupassignore, for what git keeps but
// the nodes need not (or a `!` line for what git ignores but the run
// needs).
var IgnoreFiles = []string{".gitignore", ".gpupassignore"}

// ignoreRule is one line of an ignore file, with gitignore(5)'s meaning.
type ignoreRule struct {
	domain  string   // directory of its file, relative to the work dir ("" for the root)
	parts   []string // the pattern's path segments
	anyDir  bool     // no slash but a trailing one: matches at any depth below domain
	dirOnly bool     // trailing slash: matches directories only
	negate  bool     // leading !: re-includes
	source  string   // "sub/.gitignore:3" for messages
	text    string   // the line as written
}

// Ignore is the ordered set of rules that apply in a work dir; rules of
// deeper files come later and so win, as in git.
type Ignore struct{ rules []ignoreRule }

// Add parses one ignore file's content, found in the directory domain
// (slash-separated, relative to the work dir; "" for the root).
func (ig *Ignore) Add(domain, file string, content []byte) {
	sc := bufio.NewScanner(bytes.NewReader(content))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if r, ok := parseIgnoreLine(sc.Text()); ok {
			r.domain = domain
			r.source = fmt.Sprintf("%s:%d", path.Join(domain, file), n)
			ig.rules = append(ig.rules, r)
		}
	}
}

// parseIgnoreLine reads one line as gitignore(5) says: blank lines and
// lines starting with # are nothing; trailing spaces go unless escaped;
// a leading ! negates (\! and \# are literal); a trailing / matches only
// directories; a slash at the start or in the middle anchors the pattern
// to the file's directory, else it matches at any depth.
func parseIgnoreLine(line string) (ignoreRule, bool) {
	line = strings.TrimSuffix(line, "\r")
	for strings.HasSuffix(line, " ") && !strings.HasSuffix(line, `\ `) {
		line = line[:len(line)-1]
	}
	if line == "" || line[0] == '#' {
		return ignoreRule{}, false
	}
	r := ignoreRule{text: line}
	if line[0] == '!' {
		r.negate, line = true, line[1:]
	} else if strings.HasPrefix(line, `\!`) || strings.HasPrefix(line, `\#`) {
		line = line[1:]
	}
	if strings.HasSuffix(line, "/") {
		r.dirOnly, line = true, strings.TrimRight(line, "/")
	}
	if line == "" {
		return ignoreRule{}, false
	}
	anchored := strings.Contains(line, "/")
	line = strings.TrimPrefix(line, "/")
	r.parts = strings.Split(line, "/")
	for i, p := range r.parts {
		// git's [!a] is path.Match's [^a].
		r.parts[i] = strings.ReplaceAll(p, "[!", "[^")
	}
	r.anyDir = !anchored
	return r, true
}

// Match says whether rel (slash-separated, relative to the work dir) is
// ignored, and by which rule ("file:line pattern"); the last rule that
// matches decides. A negated last match re-includes (rule is then "").
func (ig *Ignore) Match(rel string, isDir bool) (ignored bool, rule string) {
	for i := len(ig.rules) - 1; i >= 0; i-- {
		r := &ig.rules[i]
		if r.dirOnly && !isDir {
			continue
		}
		sub := rel
		if r.domain != "" {
			if !strings.HasPrefix(rel, r.domain+"/") {
				continue
			}
			sub = rel[len(r.domain)+1:]
		}
		segs := strings.Split(sub, "/")
		var ok bool
		if r.anyDir {
			ok = len(r.parts) == 1 && segMatch(r.parts[0], segs[len(segs)-1])
		} else {
			ok = matchParts(r.parts, segs)
		}
		if ok {
			if r.negate {
				return false, ""
			}
			return true, r.source + " " + r.text
		}
	}
	return false, ""
}

// matchParts matches path segments against pattern segments, where a
// "**" segment matches zero or more segments, except at the end, where
// it matches one or more ("dir/**" is what is inside dir, not dir).
func matchParts(pat, segs []string) bool {
	if len(pat) == 0 {
		return len(segs) == 0
	}
	if pat[0] == "**" {
		if len(pat) == 1 {
			return len(segs) > 0
		}
		for i := 0; i <= len(segs); i++ {
			if matchParts(pat[1:], segs[i:]) {
				return true
			}
		}
		return false
	}
	if len(segs) == 0 || !segMatch(pat[0], segs[0]) {
		return false
	}
	return matchParts(pat[1:], segs[1:])
}

// segMatch matches one name against one pattern segment (*, ?, [a-z],
// \-escapes); a malformed pattern matches nothing, as in git.
func segMatch(pat, name string) bool {
	ok, err := path.Match(pat, name)
	return err == nil && ok
}

// IgnoreLine is the ignore-file line that leaves out exactly the file
// rel (slash-separated, relative to the ignore file's directory): anchored
// with a leading slash, and with the characters a pattern gives meaning
// to escaped.
func IgnoreLine(rel string) string {
	var b strings.Builder
	b.WriteByte('/')
	for _, r := range rel {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	if strings.HasSuffix(rel, " ") {
		return b.String()[:b.Len()-1] + `\ `
	}
	return b.String()
}
