package ci

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestMask(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		vals []string
		want string
	}{
		{"github", map[string]string{"GITHUB_ACTIONS": "true"}, []string{"s3cret", "s3cret", "a\nb", " "}, "::add-mask::s3cret\n::add-mask::a\n::add-mask::b\n"},
		{"github: command data escaped", map[string]string{"GITHUB_ACTIONS": "true"}, []string{"pa%0As%25s\rw"}, "::add-mask::pa%250As%2525s%0Dw\n"},
		{"gitlab cannot mask", map[string]string{"GITLAB_CI": "true"}, []string{"s3cret"}, ""},
		{"outside CI", nil, []string{"s3cret"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var log bytes.Buffer
			e := Detect(envOf(tt.env), &log)
			for _, v := range tt.vals {
				e.Mask(v)
			}
			if diff := cmp.Diff(tt.want, log.String()); diff != "" {
				t.Errorf("log (-want +got):\n%s", diff)
			}
		})
	}
}

var delim = regexp.MustCompile(`ghadelimiter_[0-9a-f]{32}`)

func TestSetOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		kind     string // github | gitlab | none
		setFile  bool
		outputs  [][2]string
		wantFile string
		wantErr  string
	}{
		{name: "github output file", kind: "github", setFile: true, outputs: [][2]string{{"fingerprint", "sha256:ab"}, {"allocation-ids", `["a","b"]`}},
			// DELIM: each heredoc's random delimiter (ghactions).
			wantFile: "fingerprint<<DELIM\nsha256:ab\nDELIM\nallocation-ids<<DELIM\n[\"a\",\"b\"]\nDELIM\n"},
		{name: "github without GITHUB_OUTPUT is skipped", kind: "github", outputs: [][2]string{{"verdict", "consistent"}}},
		{name: "gitlab dotenv replaces a key", kind: "gitlab", setFile: true, outputs: [][2]string{{"verdict", "diverged"}, {"report-path", "r.md"}, {"verdict", "consistent"}},
			wantFile: "GPUPASS_REPORT_PATH=r.md\nGPUPASS_VERDICT=consistent\n"},
		{name: "gitlab rejects multi-line values", kind: "gitlab", setFile: true, outputs: [][2]string{{"verdict", "a\nb"}}, wantErr: "one line"},
		{name: "bad name", kind: "github", setFile: true, outputs: [][2]string{{"Bad Name", "x"}}, wantErr: "kebab-case"},
		{name: "outside CI", kind: "none", outputs: [][2]string{{"verdict", "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "out")
			env := map[string]string{}
			switch tt.kind {
			case "github":
				env["GITHUB_ACTIONS"] = "true"
				if tt.setFile {
					env["GITHUB_OUTPUT"] = file
				}
			case "gitlab":
				env["GITLAB_CI"] = "true"
				env[DotenvVar] = file
			}
			e := Detect(envOf(env), nil)
			var err error
			for _, o := range tt.outputs {
				if err = e.SetOutput(o[0], o[1]); err != nil {
					break
				}
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(file)
			if diff := cmp.Diff(tt.wantFile, delim.ReplaceAllString(string(got), "DELIM")); diff != "" {
				t.Errorf("file (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummaryIsGuarded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sum := filepath.Join(dir, "summary.md")
	if err := Detect(envOf(map[string]string{"GITHUB_ACTIONS": "true"}), nil).Summary("# x"); err != nil {
		t.Fatalf("summary without GITHUB_STEP_SUMMARY: %v", err)
	}
	e := Detect(envOf(map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": sum}), nil)
	for _, md := range []string{"# one", "two"} {
		if err := e.Summary(md); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(sum)
	if diff := cmp.Diff("# one\ntwo\n", string(got)); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
	bad := Detect(envOf(map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": filepath.Join(dir, "missing", "s.md")}), nil)
	if err := bad.Summary("x"); err == nil {
		t.Error("summary into a missing directory: want an error, not a panic")
	}
}

func TestGroupAndError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		env       map[string]string
		wantLog   []string // substrings in order
		annotated bool
	}{
		{"github", map[string]string{"GITHUB_ACTIONS": "true"}, []string{"::group::gpupass validate\n", "::endgroup::\n", "::error title=gpupass validate::bad%0Aspec\n"}, true},
		{"gitlab", map[string]string{"GITLAB_CI": "true"}, []string{"section_start:", ":gpupass_validate[collapsed=true]\r\x1b[0Kgpupass validate\n", "section_end:", ":gpupass_validate\r"}, false},
		{"none", nil, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var log bytes.Buffer
			e := Detect(envOf(tt.env), &log)
			end := e.Group("gpupass validate")
			end()
			if got := e.Error("gpupass validate", "bad\nspec"); got != tt.annotated {
				t.Errorf("Error() annotated = %v, want %v", got, tt.annotated)
			}
			rest := log.String()
			for _, w := range tt.wantLog {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("log %q lacks %q (in order)", log.String(), w)
				}
				rest = rest[i+len(w):]
			}
			if tt.wantLog == nil && log.Len() != 0 {
				t.Errorf("outside CI the log got %q", log.String())
			}
		})
	}
}

// TestSetDotenvReplacesFile: a later output replaces the dotenv file whole
// (a new inode renamed over it) instead of truncating it in place, so a
// job killed mid-write still leaves the earlier outputs for later jobs.
func TestSetDotenvReplacesFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultDotenv)
	if err := setDotenv(path, "GPUPASS_ALLOCATION_IDS", `["a"]`); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	// A hard link keeps the old inode: had the write gone through it in
	// place, a crash could have left it truncated.
	before := filepath.Join(dir, "before")
	if err := os.Link(path, before); err != nil {
		t.Fatal(err)
	}
	if err := setDotenv(path, "GPUPASS_VERDICT", "consistent"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{before, "GPUPASS_ALLOCATION_IDS=[\"a\"]\n"},
		{path, "GPUPASS_ALLOCATION_IDS=[\"a\"]\nGPUPASS_VERDICT=consistent\n"},
	} {
		got, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c.want, string(got)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", filepath.Base(c.path), diff)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("dotenv mode %v, want the file's own 0640 kept", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("files left behind: %v", entries)
	}
}
