package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/docsgen"
	"github.com/gpupass/gpupass/internal/testutil"
)

// enforceREADME holds README.md to the rule docs/ follows: every shell
// block runs as written on one machine (TestDocsShellBlocks runs it) or
// is marked with what it needs. On since the README became a short
// page (issue #32 item 8); its long sections live in docs/.
const enforceREADME = true

// page is a Markdown file whose shell blocks readers paste.
type page struct {
	path   string // from the repository root
	blocks []docsgen.Block
}

// pages reads README.md and docs/*.md and their shell blocks; a bad
// marker fails the test. With enforceREADME off the README is left out
// unless all is set.
func pages(t *testing.T, all bool) []page {
	t.Helper()
	root := testutil.RepoRoot(t)
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if enforceREADME || all {
		paths = append([]string{filepath.Join(root, "README.md")}, paths...)
	}
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
// it) and lists the README's blocks that would have to run once
// enforceREADME is on.
func TestDocsShellMarkers(t *testing.T) {
	t.Parallel()
	runnable := 0
	for _, p := range pages(t, true) {
		for _, b := range p.blocks {
			if b.NotRun != "" {
				continue
			}
			runnable++
			if p.path == "README.md" && !enforceREADME {
				t.Logf("README.md:%d: shell block neither marked nor run (enforceREADME is off): %s", b.Line, docsgen.MarkerHelp)
			}
		}
	}
	if runnable == 0 {
		t.Error("no shell block of the docs is run: TestDocsShellBlocks would pass vacuously")
	}
}

// link is a Markdown link or image target.
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks: every relative link of README.md, docs/ and docs/cli
// names a file of the repository (pages moved between them keep working).
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	var files []string
	for _, g := range []string{"README.md", "docs/*.md", "docs/cli/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		inFence := false
		for n, line := range strings.Split(string(b), "\n") {
			if s := strings.TrimSpace(line); strings.HasPrefix(s, "```") || strings.HasPrefix(s, "~~~") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(f), target)); err != nil {
					t.Errorf("%s:%d: link to %s: no such file", rel, n+1, m[1])
				}
			}
		}
	}
}
