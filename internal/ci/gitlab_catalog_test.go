package ci_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/testutil"
)

// imagePlaceholder is the image default in components/gitlab that the
// release replaces with the CLI image's digest.
const imagePlaceholder = "ghcr.io/gpupass/gpupass:0.0.0-dev"

// testImage is a CLI image reference by digest, as the release stamps it.
var testImage = "ghcr.io/gpupass/gpupass:1.2.3@sha256:" + strings.Repeat("ab", 32)

// component is one template.yml: its spec header and its job(s).
type component struct {
	name   string
	inputs map[string]struct {
		Default any    `yaml:"default"`
		Type    string `yaml:"type"`
	}
	jobs map[string]map[string]any
}

func readComponents(t *testing.T, dir string) []component {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "templates", "*", "template.yml"))
	var out []component
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		var head struct {
			Spec struct {
				Inputs map[string]struct {
					Default any    `yaml:"default"`
					Type    string `yaml:"type"`
				} `yaml:"inputs"`
			} `yaml:"spec"`
		}
		c := component{name: filepath.Base(filepath.Dir(f))}
		if err := dec.Decode(&head); err != nil {
			t.Fatalf("%s header: %v", f, err)
		}
		if err := dec.Decode(&c.jobs); err != nil {
			t.Fatalf("%s jobs: %v", f, err)
		}
		c.inputs = head.Spec.Inputs
		out = append(out, c)
	}
	return out
}

// TestComponentTemplates holds every component to what the catalog and a
// pipeline that includes it need: its job name and stage are inputs (so
// two includes make two jobs), the stage defaults exist in GitLab's
// default pipeline and put train before compare-report and audit, no job
// sets needs (so the report and the audit wait for the train jobs and
// receive their dotenv), the image is the release's CLI image with the
// entrypoint cleared, and no job builds gpupass.
func TestComponentTemplates(t *testing.T) {
	t.Parallel()
	comps := readComponents(t, filepath.Join(testutil.RepoRoot(t), "components", "gitlab"))
	var names []string
	for _, c := range comps {
		names = append(names, c.name)
	}
	if diff := cmp.Diff([]string{"audit", "bundle-push", "compare-report", "train", "validate"}, names); diff != "" {
		t.Fatalf("components (-want +got):\n%s", diff)
	}
	defaultStages := []string{".pre", "build", "test", "deploy", ".post"}
	stage := map[string]int{}
	for _, c := range comps {
		t.Run(c.name, func(t *testing.T) {
			for _, in := range []string{"job-name", "stage", "image"} {
				if _, ok := c.inputs[in]; !ok {
					t.Errorf("no %s input", in)
				}
			}
			s, _ := c.inputs["stage"].Default.(string)
			stage[c.name] = slices.Index(defaultStages, s)
			if stage[c.name] < 0 {
				t.Errorf("stage default %q is not a stage of the default pipeline %v", s, defaultStages)
			}
			if d := c.inputs["image"].Default; d != imagePlaceholder {
				t.Errorf("image default %v, want the placeholder the release stamps, %s", d, imagePlaceholder)
			}
			if _, ok := c.inputs["needs"]; ok {
				t.Errorf("a needs input: its default would cut the job off the earlier stages' dotenv")
			}
			if len(c.jobs) != 1 {
				t.Fatalf("%d jobs, want one", len(c.jobs))
			}
			for key, job := range c.jobs {
				if !strings.HasPrefix(key, "$[[ inputs.job-name ]]") {
					t.Errorf("job %q is not named by the job-name input", key)
				}
				if job["stage"] != "$[[ inputs.stage ]]" {
					t.Errorf("stage %v, want the stage input", job["stage"])
				}
				if _, ok := job["needs"]; ok {
					t.Errorf("the job sets needs")
				}
				img, _ := job["image"].(map[string]any)
				if img["name"] != "$[[ inputs.image ]]" || !cmp.Equal(img["entrypoint"], []any{""}) {
					t.Errorf("image %v, want the image input with entrypoint [\"\"] (the image's entrypoint is gpupass)", job["image"])
				}
				// The real command with the GitLab output format, configured
				// by the job's GPUPASS_* variables.
				if script, _ := job["script"].(string); !regexp.MustCompile(`^gpupass -o gitlab [a-z]+( [a-z]+)?( --[a-z-]+)*$`).MatchString(script) {
					t.Errorf("script %q, want gpupass -o gitlab COMMAND alone (no go install, no logic)", job["script"])
				}
			}
		})
	}
	for _, later := range []string{"compare-report", "audit"} {
		if stage[later] <= stage["train"] {
			t.Errorf("%s runs in a stage that is not after train's: it would not wait for the train jobs", later)
		}
	}
	if stage["train"] <= stage["validate"] {
		t.Errorf("train does not run after validate")
	}
}

// catalog runs scripts/release/gitlab-catalog.sh OUT VERSION IMAGE.
func catalog(t *testing.T, out, version, image string) (string, error) {
	t.Helper()
	cmd := exec.Command(testutil.Tool(t, "bash"), filepath.Join(testutil.RepoRoot(t), "scripts", "release", "gitlab-catalog.sh"), out, version, image)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	b, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(b))
}

// TestGitLabCatalogLayout assembles the catalog project as the release
// does (v1.2.3 → tag 1.2.3) and checks what GitLab's catalog requires and
// what users get: README, LICENSE and the pipeline at the root, every
// component as templates/<name>/template.yml, the image default stamped
// with the release's digest everywhere, a release job on semantic-version
// tags without v. A second release commits on top (a mirror), an existing
// tag never moves, and bad versions or images are refused.
func TestGitLabCatalogLayout(t *testing.T) {
	t.Parallel()
	testutil.Tool(t, "git")
	out := filepath.Join(t.TempDir(), "gpupass-components")
	if log, err := catalog(t, out, "v1.2.3", testImage); err != nil {
		t.Fatalf("gitlab-catalog.sh: %v\n%s", err, log)
	}
	for _, f := range []string{"README.md", "LICENSE", ".gitlab-ci.yml"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("the catalog project's root lacks %s", f)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(out, "LICENSE")); !strings.Contains(string(b), "Apache License") || !strings.Contains(string(b), "Version 2.0") {
		t.Errorf("LICENSE is not the Apache License 2.0")
	}
	comps := readComponents(t, out)
	if len(comps) != 5 {
		t.Errorf("%d components in the catalog tree, want 5", len(comps))
	}
	for _, c := range comps {
		if d := c.inputs["image"].Default; d != testImage {
			t.Errorf("%s image default %v, want the release's %s", c.name, d, testImage)
		}
	}
	if gitOut(t, out, "tag", "--points-at", "HEAD") != "1.2.3" {
		t.Errorf("HEAD is not tagged 1.2.3")
	}
	if s := gitOut(t, out, "status", "--porcelain"); s != "" {
		t.Errorf("files left out of the release commit:\n%s", s)
	}
	readme, _ := os.ReadFile(filepath.Join(out, "README.md"))
	if strings.Contains(string(readme), imagePlaceholder) || !strings.Contains(string(readme), "`"+testImage+"`") {
		t.Errorf("the README's input tables do not show the stamped image")
	}
	for _, f := range append([]string{"README.md"}, gitOut(t, out, "ls-files", "templates")) {
		for _, g := range strings.Fields(f) {
			b, _ := os.ReadFile(filepath.Join(out, g))
			if strings.Contains(string(b), "go install") || strings.Contains(string(b), "@latest") {
				t.Errorf("%s builds gpupass or names latest", g)
			}
		}
	}
	var pipeline struct {
		Include []struct {
			Component string `yaml:"component"`
		} `yaml:"include"`
		Release struct {
			Image string `yaml:"image"`
			Rules []struct {
				If string `yaml:"if"`
			} `yaml:"rules"`
			Release struct {
				TagName string `yaml:"tag_name"`
			} `yaml:"release"`
		} `yaml:"release"`
	}
	b, _ := os.ReadFile(filepath.Join(out, ".gitlab-ci.yml"))
	if err := yaml.Unmarshal(b, &pipeline); err != nil {
		t.Fatal(err)
	}
	included := map[string]bool{}
	for _, in := range pipeline.Include {
		m := regexp.MustCompile(`^\$CI_SERVER_FQDN/\$CI_PROJECT_PATH/([a-z-]+)@\$CI_COMMIT_SHA$`).FindStringSubmatch(in.Component)
		if m == nil {
			t.Errorf("the pipeline includes %q, want a component of this project at $CI_COMMIT_SHA", in.Component)
			continue
		}
		included[m[1]] = true
	}
	for _, c := range comps {
		if !included[c.name] {
			t.Errorf("the project's own pipeline does not exercise %s", c.name)
		}
	}
	r := pipeline.Release
	if len(r.Rules) != 1 || r.Rules[0].If != `$CI_COMMIT_TAG =~ /^\d+\.\d+\.\d+$/` || r.Release.TagName != "$CI_COMMIT_TAG" {
		t.Errorf("release job rules %+v tag %q: want it on X.Y.Z tags (no v) only", r.Rules, r.Release.TagName)
	}
	if r.Image != "registry.gitlab.com/gitlab-org/cli:latest" {
		t.Errorf("release job image %q, want GitLab's release CLI image (glab)", r.Image)
	}
	tagRe := regexp.MustCompile(`^\d+\.\d+\.\d+$`)
	for tag, want := range map[string]bool{"1.2.3": true, "v1.2.3": false, "1.2": false, "1.2.3-rc.1": false} {
		if tagRe.MatchString(tag) != want {
			t.Errorf("release rule on tag %s: %v, want %v", tag, !want, want)
		}
	}

	// The next release: one commit on top, the old tag where it was.
	first := gitOut(t, out, "rev-parse", "1.2.3")
	if log, err := catalog(t, out, "1.2.4", testImage); err != nil {
		t.Fatalf("second release: %v\n%s", err, log)
	}
	if gitOut(t, out, "rev-parse", "HEAD~1") != first || gitOut(t, out, "rev-parse", "1.2.3") != first {
		t.Errorf("the second release did not commit on top of the first")
	}
	for _, tt := range []struct{ version, image, want string }{
		{"1.2.4", testImage, "never moves"},
		{"1.2", testImage, "X.Y.Z"},
		{"v1.3.0-rc.1", testImage, "X.Y.Z"},
		{"1.3.0", "ghcr.io/gpupass/gpupass:latest", "by digest"},
	} {
		if log, err := catalog(t, out, tt.version, tt.image); err == nil || !strings.Contains(log, tt.want) {
			t.Errorf("gitlab-catalog.sh %s %s: %v %q, want a refusal naming %q", tt.version, tt.image, err, log, tt.want)
		}
	}
}
