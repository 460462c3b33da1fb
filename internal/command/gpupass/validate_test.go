package gpupass

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/examples"
	"github.com/gpupass/gpupass/internal/workdir"
)

const invalidSpec = "name: x\nruntime:\n  cuda: \"12.1\"\n  nvidia-driver: 535.104.05\n  python: 3.10.12\n  pytorch: 2.1.2+cu121\n"

func starterSpec(t *testing.T) string {
	t.Helper()
	b, err := examples.Files.ReadFile("starter/gpupass.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestMainValidate drives the real cobra tree in-process, as the binary
// would run it, and checks exit codes and what lands on stdout/stderr.
func TestMainValidate(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{"good.yaml": starterSpec(t), "bad.yaml": invalidSpec})
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string // substring
		wantStderr string // substring
		wantJSON   bool
	}{
		{name: "valid", args: []string{"validate", "--spec", good}, wantCode: 0, wantStdout: "fingerprint: sha256:"},
		{name: "invalid", args: []string{"validate", "--spec", bad}, wantCode: 1, wantStdout: "error [cuda.exact-version]"},
		{name: "short flag", args: []string{"validate", "-f", bad}, wantCode: 1, wantStdout: "bad.yaml:3:9: error"},
		{name: "json", args: []string{"validate", "--spec", good, "-o", "json"}, wantCode: 0, wantStdout: `"canonical": {`, wantJSON: true},
		{name: "json invalid", args: []string{"--output", "json", "validate", "--spec", bad}, wantCode: 1, wantStdout: `"valid": false`, wantJSON: true},
		{name: "sarif", args: []string{"validate", "--spec", bad, "-o", "sarif"}, wantCode: 1, wantStdout: `"version": "2.1.0"`, wantJSON: true},
		// --format is -o's old name: it still works, and says so on stderr.
		{name: "sarif by the old flag", args: []string{"validate", "--spec", bad, "--format", "sarif"}, wantCode: 1, wantStdout: `"version": "2.1.0"`, wantJSON: true,
			wantStderr: "gpupass: warning: --format is deprecated: use -o sarif\n"},
		{name: "gitlab by the old flag", args: []string{"validate", "--spec", bad, "--format", "gitlab", "--code-quality", filepath.Join(dir, "cq.json")}, wantCode: 1,
			wantStdout: "error [cuda.exact-version]", wantStderr: "--format is deprecated: use -o gitlab"},
		{name: "github by the old flag", args: []string{"validate", "--spec", bad, "--format", "github"}, wantCode: 1, wantStdout: "::error col=9,file=" + bad + ",line=3,",
			wantStderr: "--format is deprecated: use -o github"},
		{name: "the old flag against -o", args: []string{"validate", "--spec", good, "-o", "json", "--format", "text"}, wantCode: 2, wantStderr: "--format text with --output json: --format is the old name of --output; give -o text alone"},
		{name: "unknown format", args: []string{"validate", "--spec", good, "--format", "xml"}, wantCode: 2, wantStderr: `--format "xml"`},
		{name: "sarif is validate's", args: []string{"version", "-o", "sarif"}, wantCode: 2, wantStderr: "--output sarif: gpupass version prints text or json"},
		{name: "sarif is not a CI command's", args: []string{"compare", "-o", "sarif"}, wantCode: 2, wantStderr: "--output sarif: gpupass compare prints text, json, github or gitlab"},
		{name: "missing file", args: []string{"validate", "--spec", filepath.Join(dir, "nope.yaml")}, wantCode: 2, wantStderr: "does not exist"},
		{name: "directory", args: []string{"validate", "--spec", dir}, wantCode: 2, wantStderr: "is a directory"},
		{name: "extra argument", args: []string{"validate", "x"}, wantCode: 2, wantStderr: "unknown command"},
		{name: "invalid spec skips --local", args: []string{"validate", "--spec", bad, "--local"}, wantCode: 1, wantStdout: "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), tt.args, strings.NewReader(""), &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.wantStdout, stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantStderr, stderr.String())
			}
			if tt.wantJSON && !json.Valid(stdout.Bytes()) {
				t.Errorf("stdout is not only JSON:\n%s", stdout.String())
			}
		})
	}
}

func TestValidateLookup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		files    map[string]string
		wantFile string
		wantErr  string
	}{
		{"gpupass.yaml", map[string]string{"gpupass.yaml": invalidSpec}, "gpupass.yaml", ""},
		{"lightning-cloud.yaml when alone", map[string]string{"lightning-cloud.yaml": invalidSpec}, "lightning-cloud.yaml", ""},
		{"gpupass.yaml wins", map[string]string{"gpupass.yaml": invalidSpec, "lightning-cloud.yaml": invalidSpec}, "gpupass.yaml", ""},
		{"none", map[string]string{"other.yaml": invalidSpec}, "", "run `gpupass init`"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := &ValidateOptions{Global: &GlobalOptions{Output: "json"}, Dir: writeFiles(t, tt.files)}
			var out bytes.Buffer
			err := RunValidate(context.Background(), o, &out)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || ExitCode(err) != ExitUsage {
					t.Fatalf("err = %v (code %d), want usage error with %q", err, ExitCode(err), tt.wantErr)
				}
				return
			}
			if ExitCode(err) != ExitFindings {
				t.Fatalf("exit code %d (%v), want %d", ExitCode(err), err, ExitFindings)
			}
			var res struct{ File string }
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
			if res.File != tt.wantFile {
				t.Errorf("validated %q, want %q", res.File, tt.wantFile)
			}
		})
	}
}

// TestValidateInGitHubActions: in a workflow, text output gains
// annotations, JSON output stays pure JSON, and the fingerprint becomes a
// step output either way.
func TestValidateInGitHubActions(t *testing.T) {
	t.Parallel()
	for _, output := range []string{"text", "json"} {
		t.Run(output, func(t *testing.T) {
			t.Parallel()
			dir := writeFiles(t, map[string]string{"gpupass.yaml": starterSpec(t) + "  # trailing\n"})
			ghOut := filepath.Join(dir, "github_output")
			env := map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_OUTPUT": ghOut}
			spec := filepath.Join(dir, "gpupass.yaml")
			o := &ValidateOptions{Global: &GlobalOptions{Output: outputFormat(output)}, Spec: spec, Getenv: func(k string) string { return env[k] }}
			// A package that compiles CUDA gives a warning to annotate.
			b, _ := os.ReadFile(spec)
			os.WriteFile(spec, []byte(strings.Replace(string(b), "- numpy==1.24.2", "- deepspeed==0.14.0", 1)), 0o644)
			var out bytes.Buffer
			if err := RunValidate(context.Background(), o, &out); err != nil {
				t.Fatalf("RunValidate: %v", err)
			}
			hasAnnotation := strings.Contains(out.String(), "::warning ")
			if hasAnnotation != (output == "text") {
				t.Errorf("annotation present = %v for output %s:\n%s", hasAnnotation, output, out.String())
			}
			if output == "json" && !json.Valid(out.Bytes()) {
				t.Errorf("JSON output polluted:\n%s", out.String())
			}
			got, err := os.ReadFile(ghOut)
			if err != nil || !strings.Contains(string(got), "sha256:") {
				t.Errorf("GITHUB_OUTPUT = %q, %v; want the fingerprint", got, err)
			}
		})
	}
}

// init keeps up's state dir (database, tokens) out of git: it writes a
// .gitignore, or adds the line to the user's own once, keeping their
// rules (issue #31, finding 6).
func TestInitKeepsStateDirOutOfGit(t *testing.T) {
	t.Parallel()
	fresh, own := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(own, ".gitignore"), []byte("*.ckpt\n!best.ckpt"), 0o644); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		fresh: "# gpupass up's state dir: broker database, tokens, agents' state\n.gpupass/\n",
		own:   "*.ckpt\n!best.ckpt\n.gpupass/\n",
	} {
		for range 2 { // the second init adds nothing
			var out bytes.Buffer
			if err := RunInit(context.Background(), &InitOptions{Dir: dir}, &out); err != nil {
				t.Fatal(err)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(dir, ".gitignore")); string(b) != want {
			t.Errorf("%s/.gitignore: %q, want %q", dir, b, want)
		}
		var ig workdir.Ignore
		b, _ := os.ReadFile(filepath.Join(dir, ".gitignore"))
		ig.Add("", ".gitignore", b)
		if ignored, _ := ig.Match(".gpupass", true); !ignored {
			t.Errorf("%s/.gitignore does not ignore .gpupass/", dir)
		}
	}
}

func TestInit(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "My Project_2")
	var out bytes.Buffer
	if err := RunInit(context.Background(), &InitOptions{Dir: dir}, &out); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{".gitignore", "GPUPASS.md", "gpupass.yaml", "train.py"}, names); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	// The starter must be a valid spec, named after the directory.
	var vout bytes.Buffer
	o := &ValidateOptions{Global: &GlobalOptions{Output: "json"}, Dir: dir}
	if err := RunValidate(context.Background(), o, &vout); err != nil {
		t.Fatalf("starter spec does not validate: %v\n%s", err, vout.String())
	}
	spec, _ := os.ReadFile(filepath.Join(dir, "gpupass.yaml"))
	if !strings.Contains(string(spec), "name: my-project-2\n") {
		t.Errorf("spec name not derived from the directory:\n%s", spec)
	}

	// A second init leaves existing files alone, names them and writes
	// the missing ones; --force rewrites.
	os.WriteFile(filepath.Join(dir, "train.py"), []byte("mine"), 0o644)
	os.Remove(filepath.Join(dir, "GPUPASS.md"))
	out.Reset()
	if err = RunInit(context.Background(), &InitOptions{Dir: dir}, &out); err != nil {
		t.Fatalf("second init: %v", err)
	}
	if !strings.Contains(out.String(), "kept "+filepath.Join(dir, "train.py")) || !strings.Contains(out.String(), "wrote "+filepath.Join(dir, "GPUPASS.md")) {
		t.Errorf("second init output does not name what it kept and wrote:\n%s", out.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "train.py")); string(b) != "mine" {
		t.Error("init without --force changed an existing file")
	}
	out.Reset()
	if err := RunInit(context.Background(), &InitOptions{Dir: dir, Force: true, Name: "job", Global: &GlobalOptions{Output: "json"}}, &out); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Name  string
		Files []string
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Name != "job" || len(res.Files) != 3 {
		t.Errorf("json output %q: %+v, %v", out.String(), res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "train.py")); string(b) == "mine" {
		t.Error("--force did not rewrite train.py")
	}
	if err := RunInit(context.Background(), &InitOptions{Dir: dir, Force: true, Name: "bad: name"}, &out); err == nil {
		t.Error("want an error for a name that would break the YAML")
	}
}

// TestValidateSARIFAsBefore: `validate -o sarif` prints, byte for byte,
// what `validate --format sarif` printed before SARIF was one of -o's
// formats: testdata/sarif holds the output of main's gpupass (cb74ef3)
// for each spec, run from this directory (retaken with b025f11, main once resources.queue-timeout joined the rules, and again when resources.nodes did). The old flag prints the same
// and says on stderr to use -o.
func TestValidateSARIFAsBefore(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"design-example", "wrong-types", "design-example-fixed"} {
		want, err := os.ReadFile(filepath.Join("testdata", "sarif", name+".sarif.json"))
		if err != nil {
			t.Fatal(err)
		}
		spec := filepath.Join("..", "..", "spec", "testdata", "specs", name+".yaml")
		for _, args := range [][]string{{"-o", "sarif"}, {"--output=sarif"}, {"--format", "sarif"}} {
			var stdout, stderr bytes.Buffer
			Main(context.Background(), append([]string{"validate", "--spec", spec}, args...), strings.NewReader(""), &stdout, &stderr)
			if diff := cmp.Diff(string(want), stdout.String()); diff != "" {
				t.Errorf("%s %v differs from main's --format sarif (-main +now):\n%s", name, args, diff)
			}
			if deprecated := strings.Contains(stderr.String(), "--format is deprecated: use -o sarif"); deprecated != (args[0] == "--format") {
				t.Errorf("%s %v: stderr %q", name, args, stderr.String())
			}
		}
	}
}
