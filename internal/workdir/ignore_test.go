package workdir_test

import (
	"testing"

	"github.com/gpupass/gpupass/internal/workdir"
)

// The examples of gitignore(5) and git's own t0008 cases, one rule file
// at a time: path, whether a directory, ignored or not.
func TestIgnoreMatchesGitignoreExamples(t *testing.T) {
	t.Parallel()
	type probe struct {
		path  string
		dir   bool
		match bool
	}
	tests := []struct {
		name   string
		domain string
		rules  string
		probes []probe
	}{
		{"no slash matches at any depth", "", "hello.*", []probe{{"hello.txt", false, true}, {"a/hello.c", false, true}, {"a/xhello.c", false, false}}},
		{"a leading slash anchors", "", "/hello.*", []probe{{"hello.txt", false, true}, {"a/hello.java", false, false}}},
		{"a middle slash anchors", "", "doc/frotz/", []probe{{"doc/frotz", true, true}, {"a/doc/frotz", true, false}}},
		{"a trailing slash matches directories only", "", "frotz/", []probe{{"frotz", true, true}, {"a/frotz", true, true}, {"frotz", false, false}}},
		{"a star stops at slashes", "", "foo/*", []probe{{"foo/test.json", false, true}, {"foo/bar", true, true}, {"foo/bar/hello.c", false, false}}},
		{"leading **/ is any directory", "", "**/foo", []probe{{"foo", false, true}, {"a/b/foo", true, true}, {"afoo", false, false}}},
		{"leading **/ then a path", "", "**/foo/bar", []probe{{"foo/bar", false, true}, {"x/foo/bar", false, true}, {"foo/x/bar", false, false}}},
		{"trailing /** is what is inside", "", "abc/**", []probe{{"abc", true, false}, {"abc/x", false, true}, {"abc/x/y", false, true}}},
		{"middle /**/ is zero or more directories", "", "a/**/b", []probe{{"a/b", false, true}, {"a/x/b", false, true}, {"a/x/y/b", false, true}, {"a/x/c", false, false}}},
		{"the last match wins; ! re-includes", "", "*.log\n!keep.log", []probe{{"x.log", false, true}, {"keep.log", false, false}, {"d/keep.log", false, false}}},
		{"! then a later rule ignores again", "", "!keep.log\n*.log", []probe{{"keep.log", false, true}}},
		{"comments, blanks and escapes", "", "# a comment\n\n\\#hash\n\\!bang\n", []probe{{"#hash", false, true}, {"!bang", false, true}, {"# a comment", false, false}}},
		{"trailing spaces go, escaped ones stay", "", "foo   \nbar\\ ", []probe{{"foo", false, true}, {"bar ", false, true}, {"bar", false, false}}},
		{"brackets, [!…] and ?", "", "[!a]bc\nd?e\n[0-9].txt", []probe{{"xbc", false, true}, {"abc", false, false}, {"dxe", false, true}, {"de", false, false}, {"7.txt", false, true}}},
		{"CRLF line ends", "", "*.tmp\r\n", []probe{{"a.tmp", false, true}}},
		{"a nested file's rules are relative to its directory", "sub", "/x\ny", []probe{{"sub/x", false, true}, {"x", false, false}, {"sub/d/x", false, false}, {"sub/d/y", false, true}, {"y", false, false}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ig workdir.Ignore
			ig.Add(tc.domain, ".gitignore", []byte(tc.rules))
			for _, p := range tc.probes {
				if got, rule := ig.Match(p.path, p.dir); got != p.match {
					t.Errorf("%q (dir %v) against %q: ignored %v (%s), want %v", p.path, p.dir, tc.rules, got, rule, p.match)
				}
			}
		})
	}
}

// The rule that ignored a path is named by file and line, for the
// listing of what was left out.
func TestIgnoreNamesTheRule(t *testing.T) {
	t.Parallel()
	var ig workdir.Ignore
	ig.Add("", ".gitignore", []byte("# build output\nbuild/\n"))
	ig.Add("data", ".gpupassignore", []byte("\n*.bin\n"))
	for path, want := range map[string]string{"build": ".gitignore:2 build/", "data/x.bin": "data/.gpupassignore:2 *.bin"} {
		if _, rule := ig.Match(path, path == "build"); rule != want {
			t.Errorf("%s: rule %q, want %q", path, rule, want)
		}
	}
}

// The line printed to leave a refused file out leaves out that file and
// no other, whatever its name holds.
func TestIgnoreLineLeavesOutExactlyThatFile(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"cosign.key", "conf/config.json", "!x.pem", "#y.key", "a[1]*.key", `back\slash.key`, "sp ace.key "} {
		var ig workdir.Ignore
		ig.Add("", ".gpupassignore", []byte(workdir.IgnoreLine(name)+"\n"))
		if got, _ := ig.Match(name, false); !got {
			t.Errorf("%q: its line %q does not leave it out", name, workdir.IgnoreLine(name))
		}
		for _, other := range []string{"sub/" + name, name + "x", "a1.key"} {
			if got, _ := ig.Match(other, false); got {
				t.Errorf("%q: its line %q leaves out %q too", name, workdir.IgnoreLine(name), other)
			}
		}
	}
}
