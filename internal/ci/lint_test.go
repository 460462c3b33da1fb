package ci_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

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
	scripts := []string{filepath.Join(root, "scripts", "action", "install.sh"), filepath.Join(root, "scripts", "release", "build.sh"), filepath.Join(root, "scripts", "release", "checksums.sh"), filepath.Join(root, "scripts", "release", "gitlab-catalog.sh")}
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
