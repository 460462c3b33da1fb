package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/gpupass/gpupass/internal/command/docsgen"
	"github.com/gpupass/gpupass/internal/testutil"
)

// page is a Markdown file whose shell blocks readers paste.
type page struct {
	path   string // from the repository root
	blocks []docsgen.Block
}

// pages reads README.md and docs/*.md and their shell blocks; a bad
// marker fails the test. The README is held to the rule docs/ follows
// (issue #32 item 8): every block runs as written on one machine or is
// marked with what it needs.
func pages(t *testing.T) []page {
	t.Helper()
	root := testutil.RepoRoot(t)
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	paths = append([]string{filepath.Join(root, "README.md")}, paths...)
	var out []page
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		blocks, err := docsgen.ShellBlocks(b)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		out = append(out, page{path: rel, blocks: blocks})
	}
	return out
}

// TestDocsShellMarkers checks every marker (a reason, a shell block after
// it) and that some block is left to run.
func TestDocsShellMarkers(t *testing.T) {
	t.Parallel()
	runnable := 0
	for _, p := range pages(t) {
		for _, b := range p.blocks {
			if b.NotRun == "" {
				runnable++
			}
		}
	}
	if runnable == 0 {
		t.Error("no shell block of the docs is run: TestDocsShellBlocks would pass vacuously")
	}
}

// link is a Markdown link or image target.
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks: every relative link of README.md, SECURITY.md,
// CHANGELOG.md, docs/ and docs/cli names a file of the repository, and
// its #anchor a heading of that page (pages moved between them, or a
// heading reworded, keep their links working).
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	var files []string
	for _, g := range []string{"README.md", "SECURITY.md", "CHANGELOG.md", "docs/*.md", "docs/cli/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	anchors := map[string]map[string]bool{} // by page, read once
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for n, line := range proseLines(string(b)) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target, anchor, _ := strings.Cut(m[1], "#")
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				page := f
				if target != "" {
					page = filepath.Join(filepath.Dir(f), target)
					if _, err := os.Stat(page); err != nil {
						t.Errorf("%s:%d: link to %s: no such file", rel, n+1, m[1])
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(page, ".md") {
					continue
				}
				if anchors[page] == nil {
					pb, err := os.ReadFile(page)
					if err != nil {
						t.Fatal(err)
					}
					anchors[page] = headingAnchors(string(pb))
				}
				if !anchors[page][anchor] {
					t.Errorf("%s:%d: link to %s: no heading of that page has the anchor #%s", rel, n+1, m[1], anchor)
				}
			}
		}
	}
}

// proseLines returns a page's lines with those of fenced blocks (fences
// included) blanked: links and headings there are code.
func proseLines(page string) []string {
	lines := strings.Split(page, "\n")
	inFence := false
	for i, line := range lines {
		if s := strings.TrimSpace(line); strings.HasPrefix(s, "```") || strings.HasPrefix(s, "~~~") {
			inFence = !inFence
			lines[i] = ""
		} else if inFence {
			lines[i] = ""
		}
	}
	return lines
}

// heading is an ATX heading's text; linkText a link in it.
var (
	heading  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// headingAnchors returns the anchors GitHub gives a page's headings: the
// text lower-cased, links reduced to their text, every character but
// letters, digits, '-', '_' and spaces dropped, spaces made '-'; a
// repeated anchor gets -1, -2….
func headingAnchors(page string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, line := range proseLines(page) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(linkText.ReplaceAllString(m[1], "$1")) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n, dup := seen[a]; dup {
			seen[a] = n + 1
			a = fmt.Sprintf("%s-%d", a, n+1)
		} else {
			seen[a] = 0
		}
		out[a] = true
	}
	return out
}

func TestHeadingAnchors(t *testing.T) {
	t.Parallel()
	page := "# gpupass\n## The demo and a stack on one machine (`gpupass up`)\n### What `audit verify` proves\n" +
		"## Contexts: which broker a command talks to\n## Notes\n```sh\n# a comment, not a heading\n```\n## Notes\n"
	got := headingAnchors(page)
	for _, a := range []string{"gpupass", "the-demo-and-a-stack-on-one-machine-gpupass-up", "what-audit-verify-proves",
		"contexts-which-broker-a-command-talks-to", "notes", "notes-1"} {
		if !got[a] {
			t.Errorf("no anchor %q in %v", a, got)
		}
	}
	if got["a-comment-not-a-heading"] {
		t.Error("a comment in a fenced block was taken for a heading")
	}
}
