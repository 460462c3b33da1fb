package ci_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestComponentsREADMEListsEveryInput holds components/gitlab/README.md to
// the templates: every input of every component has a row in its table,
// with the template's default, so the catalog page never drifts.
func TestComponentsREADMEListsEveryInput(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testutil.RepoRoot(t), "components", "gitlab")
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "templates", "*", "template.yml"))
	if len(files) < 5 {
		t.Fatalf("found %d templates", len(files))
	}
	for _, f := range files {
		name := filepath.Base(filepath.Dir(f))
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Spec struct {
					Inputs map[string]struct {
						Default any `yaml:"default"`
					} `yaml:"inputs"`
				} `yaml:"spec"`
			}
			if err := yaml.NewDecoder(strings.NewReader(string(b))).Decode(&doc); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			_, section, ok := strings.Cut(string(readme), "### `"+name+"`\n")
			if !ok {
				t.Fatalf("README has no section for %s", name)
			}
			section, _, _ = strings.Cut(section, "\n### ")
			for input, spec := range doc.Spec.Inputs {
				row := ""
				for _, l := range strings.Split(section, "\n") {
					if strings.HasPrefix(l, "| `"+input+"` |") {
						row = l
					}
				}
				if row == "" {
					t.Errorf("README lacks the %s input %s", name, input)
					continue
				}
				if s, ok := spec.Default.(string); ok && s != "" && !strings.Contains(row, "`"+strings.ReplaceAll(s, "|", `\|`)+"`") {
					t.Errorf("README row of %s.%s lacks the default %q:\n%s", name, input, s, row)
				}
			}
		})
	}
}

// TestWebhookDocsShowTheExamples holds docs/webhooks.md to the pipelines
// the loop's end-to-end tests run (TestWebhookLoopThroughAct,
// TestWebhookLoopThroughGitLabCILocal read them from examples/ci): each
// is shown whole, in its own fenced block, so what a user pastes from the
// page is what was tested.
func TestWebhookDocsShowTheExamples(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "webhooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"github/gpupass-detached.yml", "github/gpupass-group-ended.yml", "gitlab/webhook.gitlab-ci.yml"} {
		b, err := os.ReadFile(filepath.Join(root, "examples", "ci", f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "```yaml\n"+string(b)+"```\n") {
			t.Errorf("docs/webhooks.md does not show examples/ci/%s whole in a ```yaml block", f)
		}
		if !strings.Contains(string(doc), "(../examples/ci/"+f+")") {
			t.Errorf("docs/webhooks.md does not link examples/ci/%s", f)
		}
	}
}
