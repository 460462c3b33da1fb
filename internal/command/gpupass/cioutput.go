package gpupass

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// The CI output formats: `-o github` and `-o gitlab` make a command do
// what a pipeline step needs besides its human text in the log: step
// outputs (GITHUB_OUTPUT) or the dotenv file (GPUPASS_DOTENV,
// GPUPASS_<OUTPUT>), the job summary, annotations, GitLab's report
// files, masked secrets and a collapsible log group. The GitHub Action
// and the GitLab components run the real commands with them, configured
// by GPUPASS_<FLAG> variables (buildkite's annotate command is the model).
// This file is the one place that decides them.

// CIOutput is the CI system output format f renders for, and whether it
// is one.
func CIOutput(f output.Format) (ci.Kind, bool) {
	switch f {
	case output.GitHub:
		return ci.GitHub, true
	case output.GitLab:
		return ci.GitLab, true
	}
	return ci.None, false
}

// CICommand declares that cmd renders the CI output formats besides text
// and json (output.Check refuses them on every other command).
func CICommand(cmd *cobra.Command) *cobra.Command {
	output.Supports(cmd, output.Text, output.JSON, output.GitHub, output.GitLab)
	return cmd
}

// CIFlag names a flag for a user who may have set it through an input of
// the GitHub Action or a GitLab component: "--spec (GPUPASS_SPEC, the
// spec input)" with a CI output format f, else "--spec".
func CIFlag(f output.Format, flag string) string {
	kind, ok := CIOutput(f)
	if !ok {
		return "--" + flag
	}
	input := flag
	if in, ok := ciInputs[kind][flag]; ok {
		input = in
	}
	return fmt.Sprintf("--%s (%s, the %s input)", flag, EnvName(flag), input)
}

// ciInputs are the inputs that set a flag of another name, by CI system:
// the action's and the components' inputs are kept as they were named.
var ciInputs = map[ci.Kind]map[string]string{
	ci.GitHub: {"follow": "wait", "region": "regions", "command": "train-command", "key": "cosign-key", "key-password": "cosign-password", "out": "audit-path", "ref": "registry-ref", "to": "wheelhouse"},
	ci.GitLab: {"follow": "wait", "pull-request": "merge-request", "key": "cosign-key", "key-password": "cosign-password", "out": "audit-path", "ref": "registry-ref"},
}

// KeyFile returns a path for a key flag's value (flag names it for
// errors): the file it names, env://VAR as given, or a private temporary
// file holding the PEM (or JSON key list) it carries, as a pipeline's
// secret input passes it. done removes that file.
func KeyFile(flag, value string) (path string, done func(), err error) {
	if strings.HasPrefix(value, "env://") {
		return value, func() {}, nil
	}
	if t := strings.TrimSpace(value); !strings.Contains(value, "-----BEGIN") && !strings.HasPrefix(t, "[") {
		if _, err := os.Stat(value); err != nil {
			// Never echo the value: it may be a mangled secret.
			return "", nil, &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s: neither a readable file nor a PEM key", flag)}
		}
		return value, func() {}, nil
	}
	f, err := os.CreateTemp("", "gpupass-key-*.pem") // mode 0600
	if err != nil {
		return "", nil, fmt.Errorf("writing the %s key: %w", flag, err)
	}
	done = func() { os.Remove(f.Name()) }
	_, err = f.WriteString(value + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		done()
		return "", nil, fmt.Errorf("writing the %s key: %w", flag, err)
	}
	return f.Name(), done, nil
}

// ciFlagNames are names (field -> "--flag") with each plain flag named as
// CIFlag names it when output is a CI output format: a library's error
// then tells a pipeline's author the input to set.
func ciFlagNames(names fielderr.Names, f output.Format) fielderr.Names {
	if _, ok := CIOutput(f); !ok {
		return names
	}
	plain := regexp.MustCompile(`^--([a-z0-9-]+)$`)
	ci := make(fielderr.Names, len(names))
	for field, name := range names {
		if m := plain.FindStringSubmatch(name); m != nil {
			name = CIFlag(f, m[1])
		}
		ci[field] = name
	}
	return ci
}
