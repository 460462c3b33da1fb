//go:build e2e

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// secretFlag is a flag line of a page's own options that says the flag
// also reads GPUPASS_<FLAG>_FILE.
var secretFlag = regexp.MustCompile(`--([a-z0-9-]+) .*\(env (GPUPASS_[A-Z0-9_]+) or GPUPASS_[A-Z0-9_]+_FILE\)`)

// TestDocumentedSecretFilesWork checks the reference's secrets against the
// built binaries: every command whose page says a flag reads
// GPUPASS_<FLAG>_FILE reads that file (the flag registry is one per
// process, and the generator builds every binary's tree in one: a flag
// secret in one binary and plain in another would be documented wrong).
// An unreadable file stops the command before it does anything.
func TestDocumentedSecretFilesWork(t *testing.T) {
	bins := map[string]string{
		"gpupass":         testutil.BuildBinary(t, "./cmd/gpupass"),
		"gpupass-broker":  testutil.BuildBinary(t, "./cmd/gpupass-broker"),
		"gpupass-agent":   testutil.BuildBinary(t, "./cmd/gpupass-agent"),
		"gpupass-loadgen": testutil.BuildBinary(t, "./cmd/gpupass-loadgen"),
	}
	pagesDir := filepath.Join(testutil.RepoRoot(t), dir)
	files, err := filepath.Glob(filepath.Join(pagesDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		if filepath.Base(f) == "README.md" {
			continue
		}
		path := strings.Split(strings.TrimSuffix(filepath.Base(f), ".md"), "_")
		bin := bins[path[0]]
		if bin == "" {
			t.Errorf("%s: no binary %s", f, path[0])
			continue
		}
		for _, s := range ownSecrets(t, f) {
			checked++
			if !readsFile(t, bin, path[1:], s) {
				t.Errorf("docs/cli/%s says %s_FILE sets --%s, but `%s` ignores it",
					filepath.Base(f), s[1], s[0], strings.Join(path, " "))
			}
		}
	}
	if checked == 0 {
		t.Fatal("no page documents a secret flag: the reference lost its _FILE variables")
	}
}

// ownSecrets returns the flag and variable of each secret under a page's
// "### Options" (its own flags; inherited ones have their own page).
func ownSecrets(t *testing.T, page string) [][2]string {
	t.Helper()
	f, err := os.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]string
	own := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "### ") {
			own = line == "### Options"
		}
		if m := secretFlag.FindStringSubmatch(line); own && m != nil {
			out = append(out, [2]string{m[1], m[2]})
		}
	}
	return out
}

// readsFile runs the command with the secret's _FILE naming a file that
// does not exist, with 0 to 3 placeholder arguments (commands check their
// arguments before their flags' variables), and says whether it refused
// to read it.
func readsFile(t *testing.T, bin string, args []string, s [2]string) bool {
	t.Helper()
	home := t.TempDir()
	for n := range 4 {
		a := append([]string{}, args...)
		for range n {
			a = append(a, "x")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, bin, a...)
		cmd.Dir = home
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home, s[1] + "_FILE=" + filepath.Join(home, "missing-secret")}
		out, _ := cmd.CombinedOutput()
		cancel()
		if strings.Contains(string(out), "reading "+s[1]+"_FILE") {
			return true
		}
	}
	return false
}
