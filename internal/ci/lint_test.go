package ci_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestActionlint runs actionlint (which runs shellcheck on every run:
// script) over the project's workflows, the examples and the act test
// workflow; the latter uses `uses: ./`, so actionlint also checks
// action.yml's metadata and the inputs passed to it.
func TestActionlint(t *testing.T) {
	t.Parallel()
	actionlint := testutil.Tool(t, "actionlint")
	testutil.Tool(t, "shellcheck")
	root := testutil.RepoRoot(t)
	var files []string
	for _, pat := range []string{".github/workflows/*.yml", "examples/ci/github/*.yml", "internal/ci/testdata/act/.github/workflows/*.yml"} {
		m, _ := filepath.Glob(filepath.Join(root, pat))
		files = append(files, m...)
	}
	if len(files) < 4 {
		t.Fatalf("found only %d workflow files: %v", len(files), files)
	}
	cmd := exec.Command(actionlint, append([]string{"-no-color"}, files...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("actionlint: %v\n%s", err, out)
	}
}

type actionMeta struct {
	Inputs map[string]struct {
		Required bool   `yaml:"required"`
		Default  string `yaml:"default"`
	} `yaml:"inputs"`
	Outputs map[string]struct {
		Value string `yaml:"value"`
	} `yaml:"outputs"`
	Runs struct {
		Using string `yaml:"using"`
		Steps []struct {
			Name  string            `yaml:"name"`
			Shell string            `yaml:"shell"`
			Run   string            `yaml:"run"`
			Env   map[string]string `yaml:"env"`
		} `yaml:"steps"`
	} `yaml:"runs"`
}

// TestActionScripts holds action.yml to its rules: no ${{ }} inside run:
// (script injection), every run: script shellcheck-clean, every input
// reaching the CLI through env, the install script shellcheck-clean.
func TestActionScripts(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "action.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var a actionMeta
	if err := yaml.Unmarshal(b, &a); err != nil {
		t.Fatalf("action.yml: %v", err)
	}
	if a.Runs.Using != "composite" {
		t.Errorf("action.yml runs.using = %q, want composite", a.Runs.Using)
	}
	passed := map[string]bool{}
	for i, s := range a.Runs.Steps {
		if strings.Contains(s.Run, "${{") {
			t.Errorf("step %d (%s): ${{ }} inside run: lets input values become shell code; pass them through env:", i, s.Name)
		}
		for _, v := range s.Env {
			if strings.HasPrefix(v, "${{ inputs.") {
				passed[strings.TrimSuffix(strings.TrimPrefix(v, "${{ inputs."), " }}")] = true
			}
		}
	}
	for name := range a.Inputs {
		if name == "working-directory" {
			continue // a step property, not an env value
		}
		if !passed[name] {
			t.Errorf("input %s never reaches the CLI through env:", name)
		}
	}
	for _, o := range []string{"fingerprint", "allocation-ids", "report-path", "verdict", "bundle-digest", "audit-path"} {
		if want := "${{ steps.run.outputs." + o + " }}"; a.Outputs[o].Value != want {
			t.Errorf("output %s = %q, want %q", o, a.Outputs[o].Value, want)
		}
	}

	shellcheck := testutil.Tool(t, "shellcheck")
	dir := t.TempDir()
	scripts, _ := filepath.Glob(filepath.Join(root, "scripts", "release", "*.sh"))
	scripts = append(scripts, filepath.Join(root, "scripts", "action", "install.sh"))
	for i, s := range a.Runs.Steps {
		p := filepath.Join(dir, "step"+string(rune('0'+i))+".sh")
		if err := os.WriteFile(p, []byte("#!/usr/bin/env bash\n"+s.Run+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		scripts = append(scripts, p)
	}
	if out, err := exec.Command(shellcheck, scripts...).CombinedOutput(); err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}

// TestWorkflowActionsPinned holds the project's workflows and the action
// to pinned actions: every remote `uses:` names a full commit SHA with the
// release it is in a comment, so a moved tag upstream changes nothing here.
func TestWorkflowActionsPinned(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yml"))
	files = append(files, filepath.Join(root, "action.yml"))
	uses := regexp.MustCompile(`^\s*(?:-\s+)?uses:\s*(\S+)(.*)$`)
	pinned := regexp.MustCompile(`^[\w.-]+/[\w./-]+@[0-9a-f]{40}$`)
	release := regexp.MustCompile(`^\s*#\s*v\d+\.\d+\.\d+\b`)
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			m := uses.FindStringSubmatch(line)
			if m == nil || strings.HasPrefix(m[1], "./") || strings.HasPrefix(m[1], "docker://") {
				continue
			}
			n++
			if !pinned.MatchString(m[1]) || !release.MatchString(m[2]) {
				t.Errorf("%s:%d: uses %s%s: pin a remote action by its full commit SHA with the release in a comment (uses: owner/repo@<40 hex> # vX.Y.Z)", filepath.Base(f), i+1, m[1], m[2])
			}
		}
	}
	if n == 0 {
		t.Errorf("no remote actions found in %v", files)
	}
}

// TestExampleUsesActionInputs checks the inputs the GitHub example passes
// to gpupass/gpupass@v1 against action.yml: actionlint cannot, as it does
// not fetch remote actions' metadata.
func TestExampleUsesActionInputs(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "action.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var a actionMeta
	if err := yaml.Unmarshal(b, &a); err != nil {
		t.Fatal(err)
	}
	b, err = os.ReadFile(filepath.Join(root, "examples", "ci", "github", "gpupass.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		Jobs map[string]struct {
			Steps []struct {
				Uses string            `yaml:"uses"`
				With map[string]string `yaml:"with"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(b, &wf); err != nil {
		t.Fatal(err)
	}
	n := 0
	for job, j := range wf.Jobs {
		for _, s := range j.Steps {
			if !strings.HasPrefix(s.Uses, "gpupass/gpupass@") {
				continue
			}
			n++
			for k := range s.With {
				if _, ok := a.Inputs[k]; !ok {
					t.Errorf("job %s passes %s, which action.yml does not declare", job, k)
				}
			}
		}
	}
	if n < 5 {
		t.Errorf("the example uses the action %d times, want validate, train ×2, compare-report and audit", n)
	}
}

// TestCIExamplesUseUpRegions holds the shipped CI pipelines and their docs
// to the regions `gpupass up` starts agents in: a new user runs `up`, then
// pastes an example, and a region no agent is in leaves its runs pending
// forever. Checked: every region a train job names (region: / regions:),
// every allocation id read from train's allocation-ids output, and every
// GPUPASS_ALLOCATION_<REGION> variable from its dotenv.
func TestCIExamplesUseUpRegions(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	known := map[string]bool{}
	// The dotenv variable of a region: upper-cased, any other character
	// than a letter or digit → _ (components/gitlab/README.md).
	dotenv := map[string]bool{"GPUPASS_ALLOCATION_IDS": true}
	var dotenvNames []string
	other := regexp.MustCompile(`[^a-z0-9]`)
	for _, r := range localstack.DefaultRegions() {
		known[r] = true
		v := "GPUPASS_ALLOCATION_" + strings.ToUpper(other.ReplaceAllString(r, "_"))
		dotenv[v] = true
		dotenvNames = append(dotenvNames, v)
	}
	files := []string{"components/gitlab/.gitlab-ci.yml", "components/gitlab/README.md", "docs/ci.md"}
	tmpl, _ := filepath.Glob(filepath.Join(root, "components", "gitlab", "templates", "*", "template.yml"))
	for _, f := range tmpl {
		rel, _ := filepath.Rel(root, f)
		files = append(files, rel)
	}
	if err := filepath.WalkDir(filepath.Join(root, "examples", "ci"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	regionKey := regexp.MustCompile(`^\s*(?:-\s+)?regions?:\s*(\S.*)$`)
	idsKey := regexp.MustCompile(`outputs\.allocation-ids\)(?:\.([A-Za-z0-9_-]+)|\['([^']*)'\])`)
	dotenvVar := regexp.MustCompile(`\bGPUPASS_ALLOCATION_[A-Z0-9_]+`)
	named := 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			var regions []string
			if m := regionKey.FindStringSubmatch(line); m != nil {
				regions = strings.FieldsFunc(m[1], func(r rune) bool { return r == ',' || r == ' ' })
			}
			for _, m := range idsKey.FindAllStringSubmatch(line, -1) {
				regions = append(regions, m[1]+m[2])
			}
			for _, r := range regions {
				named++
				if !known[r] {
					t.Errorf("%s:%d: region %q: `gpupass up` starts agents in %v only; use one of those", f, i+1, r, localstack.DefaultRegions())
				}
			}
			for _, v := range dotenvVar.FindAllString(line, -1) {
				named++
				if !dotenv[v] {
					t.Errorf("%s:%d: $%s is the allocation of no region `gpupass up` starts agents in: use one of %v", f, i+1, v, dotenvNames)
				}
			}
		}
	}
	if named < 10 {
		t.Errorf("found %d region names in %v: the patterns no longer match the files", named, files)
	}
}
