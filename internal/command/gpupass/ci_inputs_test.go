package gpupass

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/command/registryflags"
)

// TestCIInputsMatchFlags holds the action and the GitLab templates to the
// CLI: every GPUPASS_<INPUT> they set must be a flag of `gpupass ci step`
// (or of the command it dispatches to), or the value would be dropped
// without a word.
func TestCIInputsMatchFlags(t *testing.T) {
	t.Parallel()
	step := &cobra.Command{Use: "step"}
	(&CIStepOptions{}).AddFlags(step)
	known := map[string]bool{"GPUPASS_DOTENV": true, "GPUPASS_INSTALL_VERSION": true, "GPUPASS_ACTION_PATH": true, "GPUPASS_ACTION_REPOSITORY": true}
	step.Flags().VisitAll(func(f *pflag.Flag) { known[EnvName(f.Name)] = true })
	// The bundle steps read the registry flags' variables (bundlecmd).
	bundle := &cobra.Command{Use: "push"}
	(&registryflags.Flags{}).AddFlags(bundle.Flags())
	bundle.Flags().VisitAll(func(f *pflag.Flag) { known[EnvName(f.Name)] = true })

	root := filepath.Join("..", "..", "..")
	files, _ := filepath.Glob(filepath.Join(root, "components", "gitlab", "templates", "*", "template.yml"))
	files = append(files, filepath.Join(root, "action.yml"))
	if len(files) < 6 {
		t.Fatalf("found %d files", len(files))
	}
	re := regexp.MustCompile(`(?m)^\s+(GPUPASS_[A-Z_]+):`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			if !known[m[1]] {
				t.Errorf("%s sets %s, which no gpupass ci step flag reads", strings.TrimPrefix(f, root+"/"), m[1])
			}
		}
	}
}
