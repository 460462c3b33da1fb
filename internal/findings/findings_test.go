package findings

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/spec"
)

var update = flag.Bool("update", false, "rewrite golden files")

// corpus validates the spec package's corpus, naming each file by its base
// name so goldens do not depend on where the tests run.
func corpus(t *testing.T) []*spec.Result {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "spec", "testdata", "specs", "*.yaml"))
	if err != nil || len(files) < 30 {
		t.Fatalf("corpus: %d files, %v", len(files), err)
	}
	var out []*spec.Result
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, spec.Validate(filepath.Base(f), b))
	}
	return out
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden (run go test -update): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

// TestGoldens renders the whole corpus in every format.
func TestGoldens(t *testing.T) {
	t.Parallel()
	results := corpus(t)
	for _, tt := range []struct {
		format, golden string
		write          func(io.Writer, []*spec.Result) error
	}{
		{"text", "corpus.txt", func(w io.Writer, r []*spec.Result) error { return Text(w, r, false) }},
		{"json", "corpus.json", JSON},
		{"github", "corpus.github.txt", func(w io.Writer, r []*spec.Result) error { return GitHub(w, r, nil) }},
		{"gitlab", "corpus.gitlab.json", GitLab},
		{"sarif", "corpus.sarif.json", func(w io.Writer, r []*spec.Result) error { return SARIF(w, r, "test") }},
	} {
		t.Run(tt.format, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := tt.write(&b, results); err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(tt.golden, ".json") && !json.Valid(b.Bytes()) {
				t.Fatalf("%s output is not JSON", tt.format)
			}
			checkGolden(t, tt.golden, b.Bytes())
		})
	}
}

func TestTextColorOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	res := spec.Validate("x.yaml", []byte("name: x\nruntime: {cuda: \"12.1\"}\n"))
	for _, color := range []bool{false, true} {
		var b bytes.Buffer
		if err := Text(&b, []*spec.Result{res}, color); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(b.String(), "\x1b["); got != color {
			t.Errorf("color=%v: ANSI escapes present = %v\n%s", color, got, b.String())
		}
		if !strings.Contains(b.String(), "x.yaml:2:17: ") {
			t.Errorf("color=%v: missing positioned finding:\n%s", color, b.String())
		}
	}
}

func TestGitHubAnnotationsAndOutput(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "github_output")
	env := map[string]string{"GITHUB_OUTPUT": out}
	getenv := func(k string) string { return env[k] }

	valid := spec.Validate("gpupass.yaml", []byte("name: x\nruntime:\n  cuda: 12.1.105\n  nvidia-driver: 535.104.05\n  python: 3.10.12\n  pytorch: 2.1.2+cu121\n  packages: [deepspeed==0.14.0]\n"))
	if !valid.Valid {
		t.Fatalf("want a valid spec: %+v", valid.Findings)
	}
	var b bytes.Buffer
	if err := GitHub(&b, []*spec.Result{valid}, getenv); err != nil {
		t.Fatal(err)
	}
	want := "::warning col=14,file=gpupass.yaml,line=7,title=gpupass package.nvcc-build::"
	if !strings.HasPrefix(b.String(), want) {
		t.Errorf("annotation = %q, want prefix %q", b.String(), want)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("GITHUB_OUTPUT not written: %v", err)
	}
	if !strings.Contains(string(got), valid.Fingerprint) || !strings.HasPrefix(string(got), "fingerprint<<") {
		t.Errorf("GITHUB_OUTPUT = %q, want the fingerprint output", got)
	}

	// Without GITHUB_OUTPUT nothing is written and nothing panics.
	b.Reset()
	if err := GitHub(&b, []*spec.Result{valid}, nil); err != nil {
		t.Fatal(err)
	}
	// An unwritable GITHUB_OUTPUT is an error, not a panic.
	env["GITHUB_OUTPUT"] = filepath.Join(t.TempDir(), "missing-dir", "out")
	if err := GitHub(&b, []*spec.Result{valid}, getenv); err == nil {
		t.Error("want an error for an unwritable GITHUB_OUTPUT")
	}
}

func TestSARIFStructure(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := SARIF(&b, corpus(t), "test"); err != nil {
		t.Fatal(err)
	}
	var log struct {
		Version string
		Runs    []struct {
			Tool struct {
				Driver struct {
					Rules []struct{ ID string }
				}
			}
			Results []struct {
				RuleID    string
				RuleIndex int
				Level     string
			}
		}
	}
	if err := json.Unmarshal(b.Bytes(), &log); err != nil {
		t.Fatal(err)
	}
	if log.Version != "2.1.0" || len(log.Runs) != 1 || len(log.Runs[0].Results) == 0 {
		t.Fatalf("unexpected SARIF shape: version %q, %d runs", log.Version, len(log.Runs))
	}
	rules := log.Runs[0].Tool.Driver.Rules
	for _, r := range log.Runs[0].Results {
		if r.RuleIndex >= len(rules) || rules[r.RuleIndex].ID != r.RuleID {
			t.Errorf("result %s has ruleIndex %d pointing elsewhere", r.RuleID, r.RuleIndex)
		}
		switch r.Level {
		case "error", "warning", "note":
		default:
			t.Errorf("invalid SARIF level %q", r.Level)
		}
	}
}

func TestGitLabFingerprintsUnique(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := GitLab(&b, corpus(t)); err != nil {
		t.Fatal(err)
	}
	var issues []gitlabIssue
	if err := json.Unmarshal(b.Bytes(), &issues); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, is := range issues {
		if is.Location.Path == "" || is.Location.Lines.Begin < 1 {
			t.Errorf("issue without location: %+v", is)
		}
		key := is.Location.Path + is.Description
		if prev, dup := seen[is.Fingerprint]; dup && prev != key {
			t.Errorf("fingerprint %s shared by different issues", is.Fingerprint)
		}
		seen[is.Fingerprint] = key
	}
}

func TestPaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, got, want string
	}{
		{"workspace-relative", workspacePath("/ws/repo/train/gpupass.yaml", "/ws/repo"), "train/gpupass.yaml"},
		{"outside the workspace", workspacePath("/elsewhere/gpupass.yaml", "/ws/repo"), "/elsewhere/gpupass.yaml"},
		{"no workspace", workspacePath("gpupass.yaml", ""), "gpupass.yaml"},
		{"sarif relative", sarifURI("sub/gpupass.yaml"), "sub/gpupass.yaml"},
		{"sarif absolute", sarifURI("/tmp/my spec.yaml"), "file:///tmp/my%20spec.yaml"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}
