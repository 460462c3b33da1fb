package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/editdist"
)

// Limits that keep hostile input cheap. A real spec is a few kilobytes
// with a few hundred nodes.
const (
	// MaxSize is the largest spec file accepted, in bytes. Callers reading
	// a file need read no more than MaxSize+1 bytes.
	MaxSize = 1 << 20
	// maxNodes bounds the YAML nodes of a document (aliases are not
	// expanded, so this also bounds our walk).
	maxNodes = 100_000
	// maxAliases bounds alias nodes: a spec needs few, a "billion laughs"
	// needs many.
	maxAliases = 1_000
)

// Position is a 1-based line and column in the spec file.
type Position struct {
	Line, Column int
}

// Document is a parsed spec with the position of every value, so rules
// can point at the line that holds the problem.
type Document struct {
	File string
	Spec Spec
	// Packages holds the position of each runtime.packages entry.
	pos     map[string]Position // value positions by dotted path
	keyPos  map[string]Position // key positions by dotted path
	present map[string]bool     // set, with a value of the right type
	invalid map[string]bool     // set, with a value of the wrong type
}

// Invalid reports whether path was set to a value of the wrong type
// (already reported; rules should not pile on).
func (d *Document) Invalid(path string) bool { return d.invalid[path] }

// Has reports whether the spec sets path ("runtime.bundle").
func (d *Document) Has(path string) bool { return d.present[path] }

// At returns the position of path's value, or of its nearest parent that
// is present, or 1:1.
func (d *Document) At(path string) Position {
	for p := path; p != ""; p = parent(p) {
		if pos, ok := d.pos[p]; ok {
			return pos
		}
	}
	return Position{1, 1}
}

// KeyAt returns the position of path's key (or At(path) when unknown).
func (d *Document) KeyAt(path string) Position {
	if pos, ok := d.keyPos[path]; ok {
		return pos
	}
	return d.At(path)
}

func parent(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

// Parse reads a spec from data. It never fails: every problem, including
// a file that is not YAML at all, is a positioned finding. The Document is
// nil when nothing of the spec could be read.
func Parse(file string, data []byte) (*Document, []Finding) {
	p := &parser{doc: &Document{
		File: file, pos: map[string]Position{}, keyPos: map[string]Position{},
		present: map[string]bool{}, invalid: map[string]bool{},
	}}
	root := p.load(data)
	if root == nil {
		return nil, p.findings
	}
	if root.Kind != yaml.MappingNode {
		// Nothing of the schema can be read from a list or a scalar; a
		// finding per missing field would only bury this one.
		p.add("yaml.type", SevError, p.at(root), "",
			"the spec must be a mapping of keys (name, runtime, security, resources, metrics), got "+kindName(root),
			"run `gpupass init` for a starter spec")
		return nil, p.findings
	}
	p.top(root)
	if !p.doc.Has("resources.count") {
		p.doc.Spec.Resources.Count = 1 // one accelerator unless told otherwise
	}
	return p.doc, p.findings
}

type parser struct {
	doc      *Document
	findings []Finding
	aliases  int
}

func (p *parser) add(rule string, sev Severity, pos Position, path, msg, fix string) {
	p.findings = append(p.findings, Finding{
		Rule: rule, Severity: sev, File: p.doc.File, Line: pos.Line, Column: pos.Column,
		Path: path, Message: msg, Fix: fix,
	})
}

var yamlLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^yaml: line (\d+): (.*)$`) })

// load checks the bytes and decodes them into a YAML node tree.
func (p *parser) load(data []byte) *yaml.Node {
	if len(data) > MaxSize {
		p.add("yaml.too-large", SevError, Position{1, 1}, "",
			fmt.Sprintf("file is larger than %d bytes; a spec is a few kilobytes", MaxSize),
			"check that --spec names the spec and not another file")
		return nil
	}
	if pos, bad := firstBadByte(data); bad {
		p.add("yaml.encoding", SevError, pos, "",
			"file is not UTF-8 text (binary data or another encoding)",
			"save the spec as UTF-8 YAML")
		return nil
	}
	if len(bytes.TrimSpace(data)) == 0 {
		p.add("yaml.empty", SevError, Position{1, 1}, "", "file is empty",
			"run `gpupass init` for a starter spec")
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.add("yaml.empty", SevError, Position{1, 1}, "", "file holds only comments",
				"run `gpupass init` for a starter spec")
			return nil
		}
		p.syntaxError(data, err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.add("yaml.multiple-documents", SevError, Position{extra.Line, extra.Column}, "",
			"file holds more than one YAML document", "remove the '---' line and everything after it, or split the file")
	} else if !errors.Is(err, io.EOF) {
		p.syntaxError(data, err)
		return nil
	}
	nodes, aliases, first := 0, 0, Position{}
	countNodes(&doc, &nodes, &aliases, &first)
	if aliases > maxAliases {
		p.add("yaml.aliases", SevError, firstOr(first), "",
			fmt.Sprintf("document has more than %d aliases; a spec needs few (alias-expansion bomb?)", maxAliases),
			"write the values out instead of using anchors and aliases")
		return nil
	}
	if nodes > maxNodes {
		p.add("yaml.too-large", SevError, Position{1, 1}, "",
			fmt.Sprintf("document has more than %d YAML nodes; a spec has a few hundred", maxNodes),
			"check that --spec names the spec and not another file")
		return nil
	}
	if len(doc.Content) == 0 {
		p.add("yaml.empty", SevError, Position{1, 1}, "", "file holds no spec", "run `gpupass init` for a starter spec")
		return nil
	}
	root := p.resolve(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		p.add("yaml.empty", SevError, Position{1, 1}, "", "file holds no spec", "run `gpupass init` for a starter spec")
		return nil
	}
	return root
}

func firstOr(p Position) Position {
	if p.Line == 0 {
		return Position{1, 1}
	}
	return p
}

// countNodes counts nodes without following aliases, so it is linear in
// the document even when aliases would expand exponentially.
func countNodes(n *yaml.Node, nodes, aliases *int, first *Position) {
	stack := []*yaml.Node{n}
	for len(stack) > 0 && *nodes <= maxNodes {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		*nodes++
		if n.Kind == yaml.AliasNode {
			*aliases++
			if first.Line == 0 {
				*first = Position{n.Line, n.Column}
			}
		}
		stack = append(stack, n.Content...)
	}
}

// firstBadByte finds a NUL or invalid UTF-8, which YAML text never holds.
func firstBadByte(data []byte) (Position, bool) {
	line, col := 1, 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == 0 || (r == utf8.RuneError && size <= 1) {
			return Position{line, col}, true
		}
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		i += size
	}
	return Position{}, false
}

// syntaxError turns a yaml.v3 error into a positioned finding. yaml.v3
// reports lines but not columns; for tabs we find the column ourselves.
func (p *parser) syntaxError(data []byte, err error) {
	msg := err.Error()
	pos := Position{1, 1}
	if m := yamlLine().FindStringSubmatch(msg); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			pos.Line = n
		}
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	lines := strings.Split(string(data), "\n")
	// yaml.v3 reports a tab on the line after the one it names at times;
	// look at both before calling it a plain syntax error.
	for _, ln := range []int{pos.Line, pos.Line + 1} {
		if ln < 1 || ln > len(lines) {
			continue
		}
		text := lines[ln-1]
		indent := text[:len(text)-len(strings.TrimLeft(text, " \t"))]
		if i := strings.IndexByte(indent, '\t'); i >= 0 {
			p.add("yaml.syntax", SevError, Position{ln, i + 1}, "",
				"tab character in indentation; YAML indents with spaces only",
				"replace the tab with spaces")
			return
		}
	}
	p.add("yaml.syntax", SevError, pos, "", "not valid YAML: "+msg,
		"fix the YAML syntax at this line (indentation, quotes, a missing ':')")
}

func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		p.aliases++
		n = n.Alias
	}
	return n
}

func (p *parser) at(n *yaml.Node) Position { return Position{n.Line, n.Column} }

// typeErr reports a value of the wrong type and marks the path invalid,
// so rules treat it as neither present nor missing.
func (p *parser) typeErr(n *yaml.Node, path, msg, fix string) {
	p.add("yaml.type", SevError, p.at(n), path, msg, fix)
	delete(p.doc.present, path)
	p.doc.invalid[path] = true
}

// kindName is how a node's type is named in messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "null"
		case "!!bool":
			return "a boolean (" + n.Value + ")"
		case "!!int":
			return "an integer (" + n.Value + ")"
		case "!!float":
			return "a number (" + n.Value + ")"
		}
		return fmt.Sprintf("a string (%q)", clip(n.Value))
	}
	return "an unexpected node"
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}

type field struct {
	name string
	fn   func(path string, v *yaml.Node)
}

// mapping walks a mapping node: duplicate keys and unknown keys become
// findings, known keys go to their handler.
func (p *parser) mapping(n *yaml.Node, path string, fields []field) bool {
	n = p.resolve(n)
	if n.Kind != yaml.MappingNode {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return false
		}
		p.typeErr(n, path,
			fmt.Sprintf("%s must be a mapping of keys, got %s", orTop(path), kindName(n)),
			"write it as `key: value` lines indented under it")
		return false
	}
	seen := map[string]Position{}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := p.resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.add("yaml.type", SevError, p.at(k), path, "keys must be plain names, got "+kindName(k), "")
			continue
		}
		sub := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			p.add("yaml.duplicate-key", SevError, p.at(k), sub,
				fmt.Sprintf("key %q appears twice in %s (first at line %d)", k.Value, orTop(path), first.Line),
				"keep one of them; YAML would silently use the last")
			continue
		}
		seen[k.Value] = p.at(k)
		i := slices.Index(names, k.Value)
		if i < 0 {
			msg := fmt.Sprintf("unknown key %q in %s", clip(k.Value), orTop(path))
			fix := "known keys here: " + strings.Join(names, ", ")
			if s := suggest(k.Value, names); len(s) > 0 {
				msg += didYouMean(s)
				fix = fmt.Sprintf("rename it to %q", s[0])
			}
			p.add("yaml.unknown-key", SevError, p.at(k), sub, msg, fix)
			continue
		}
		vr := p.resolve(v)
		p.doc.present[sub] = true
		p.doc.keyPos[sub] = p.at(k)
		p.doc.pos[sub] = p.at(v) // where it is written, even through an alias
		fields[i].fn(sub, vr)
	}
	return true
}

func orTop(path string) string {
	if path == "" {
		return "the spec"
	}
	return path
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// suggest returns the known names an unknown value is likely a typo of:
// the same name with other separators or case, the names it is a prefix
// of ("h100" -> h100-pcie, h100-sxm5, ...), or the closest within a small
// edit distance.
func suggest(key string, names []string) []string {
	flat := func(s string) string { return strings.ToLower(separators.Replace(s)) }
	var prefixed []string
	best, bestD := "", 1<<30
	for _, n := range names {
		if flat(n) == flat(key) {
			return []string{n}
		}
		if len(key) >= 2 && strings.HasPrefix(n, strings.ToLower(key)) {
			prefixed = append(prefixed, n)
		}
		if d := editDistance(strings.ToLower(key), n); d < bestD {
			best, bestD = n, d
		}
	}
	if len(prefixed) > 0 {
		return prefixed
	}
	if bestD <= max(2, len(best)/3) {
		return []string{best}
	}
	return nil
}

var separators = strings.NewReplacer("-", "", "_", "")

// didYouMean formats suggestions for a message: `; did you mean "a"?`.
func didYouMean(s []string) string {
	if len(s) == 0 {
		return ""
	}
	q := make([]string, len(s))
	for i, n := range s {
		q[i] = strconv.Quote(n)
	}
	if len(q) == 1 {
		return "; did you mean " + q[0] + "?"
	}
	return "; did you mean " + strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1] + "?"
}

// editDistance is the one edit distance (bounded input: keys only).
func editDistance(a, b string) int { return editdist.Distance(a, b) }

// str reads a scalar as text. Versions such as `cuda: 12.1` arrive as
// YAML floats; the text as written is what we keep.
func (p *parser) str(dst *string) func(string, *yaml.Node) {
	return func(path string, v *yaml.Node) {
		if v.Kind != yaml.ScalarNode {
			p.typeErr(v, path,
				fmt.Sprintf("%s must be a single value, got %s", path, kindName(v)), "write it on one line: `key: value`")
			return
		}
		if v.Tag == "!!null" {
			return // reported as missing by the rules when required
		}
		*dst = strings.TrimSpace(v.Value)
	}
}

func (p *parser) boolean(dst *bool) func(string, *yaml.Node) {
	return func(path string, v *yaml.Node) {
		if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
			p.typeErr(v, path,
				fmt.Sprintf("%s must be true or false, got %s", path, kindName(v)), "write true or false")
			return
		}
		*dst = v.Value == "true" || v.Value == "True" || v.Value == "TRUE"
	}
}

func (p *parser) integer(dst *int) func(string, *yaml.Node) {
	return func(path string, v *yaml.Node) {
		if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
			p.typeErr(v, path,
				fmt.Sprintf("%s must be an integer, got %s", path, kindName(v)), "write a whole number without quotes, e.g. 8")
			return
		}
		n, err := strconv.ParseInt(strings.ReplaceAll(v.Value, "_", ""), 0, 32)
		if err != nil {
			p.typeErr(v, path,
				fmt.Sprintf("%s: %q is out of range", path, clip(v.Value)), "write a smaller whole number")
			return
		}
		*dst = int(n)
	}
}

func (p *parser) number(dst *float64) func(string, *yaml.Node) {
	return func(path string, v *yaml.Node) {
		if v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && v.Tag != "!!float") {
			p.typeErr(v, path,
				fmt.Sprintf("%s must be a number, got %s", path, kindName(v)), "write a number without quotes, e.g. 200")
			return
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(v.Value, "_", ""), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			p.typeErr(v, path,
				fmt.Sprintf("%s: %q is not a finite number", path, clip(v.Value)), "write a finite number, e.g. 200")
			return
		}
		*dst = f
	}
}

// top walks the root mapping along the schema of DESIGN §2.
func (p *parser) top(root *yaml.Node) {
	s := &p.doc.Spec
	p.mapping(root, "", []field{
		{"name", p.str(&s.Name)},
		{"description", p.str(&s.Description)},
		{"runtime", func(path string, v *yaml.Node) {
			r := &s.Runtime
			p.mapping(v, path, []field{
				{"cuda", p.str(&r.CUDA)},
				{"nvidia-driver", p.str(&r.NvidiaDriver)},
				{"python", p.str(&r.Python)},
				{"pytorch", p.str(&r.PyTorch)},
				{"cuda-malloc-async", p.boolean(&r.CUDAMallocAsync)},
				{"cuda-malloc-async-release-threshold", p.str(&r.CUDAMallocAsyncReleaseThreshold)},
				{"packages", p.packages(&r.Packages)},
				{"bundle", p.str(&r.Bundle)},
			})
		}},
		{"security", func(path string, v *yaml.Node) {
			p.mapping(v, path, []field{
				{"fips-compliant", p.boolean(&s.Security.FIPSCompliant)},
				{"no-internet-access", p.boolean(&s.Security.NoInternetAccess)},
			})
		}},
		{"resources", func(path string, v *yaml.Node) {
			r := &s.Resources
			p.mapping(v, path, []field{
				{"accelerator", p.str(&r.Accelerator)},
				{"count", p.integer(&r.Count)},
				{"nodes", p.integer(&r.Nodes)},
				{"storage", func(path string, v *yaml.Node) {
					p.mapping(v, path, []field{
						{"type", p.str(&r.Storage.Type)},
						{"size_gb", p.integer(&r.Storage.SizeGB)},
					})
				}},
				{"network", func(path string, v *yaml.Node) {
					p.mapping(v, path, []field{
						{"bandwidth_gbps", p.number(&r.Network.BandwidthGbps)},
						{"latency_tolerance_ms", p.number(&r.Network.LatencyToleranceMS)},
					})
				}},
				{"time-limit", p.str(&r.TimeLimit)},
				{"queue-timeout", p.str(&r.QueueTimeout)},
			})
		}},
		{"metrics", func(path string, v *yaml.Node) {
			p.mapping(v, path, []field{
				{"pattern", p.str(&s.Metrics.Pattern)},
			})
		}},
	})
}

func (p *parser) packages(dst *[]string) func(string, *yaml.Node) {
	return func(path string, v *yaml.Node) {
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			return
		}
		if v.Kind != yaml.SequenceNode {
			p.typeErr(v, path,
				fmt.Sprintf("%s must be a list, got %s", path, kindName(v)), "write one `- name==version` line per package")
			return
		}
		for _, written := range v.Content {
			item := p.resolve(written)
			sub := fmt.Sprintf("%s[%d]", path, len(*dst))
			if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
				p.typeErr(written, path,
					fmt.Sprintf("each package must be a `name==version` string, got %s", kindName(item)),
					"write `- name==version`")
				continue
			}
			p.doc.pos[sub] = p.at(written)
			p.doc.present[sub] = true
			*dst = append(*dst, strings.TrimSpace(item.Value))
		}
	}
}
