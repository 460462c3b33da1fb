package gpupass

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/gpupass/gpupass/internal/ci"
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

// ciCommands are the commands that render the CI output formats.
var ciCommands = []string{"gpupass validate", "gpupass compare", "gpupass train"}

// ciOutput is the CI system g's --output renders for, and whether it is one.
func ciOutput(g *GlobalOptions) (ci.Kind, bool) {
	if g == nil {
		return ci.None, false
	}
	switch g.Output {
	case string(ci.GitHub):
		return ci.GitHub, true
	case string(ci.GitLab):
		return ci.GitLab, true
	}
	return ci.None, false
}

// validateOutput checks --output for the command at path ("gpupass
// validate"): text and json everywhere, github and gitlab where the
// command renders them.
func validateOutput(output, path string) error {
	switch output {
	case "text", "json":
		return nil
	case string(ci.GitHub), string(ci.GitLab):
		if slices.Contains(ciCommands, path) {
			return nil
		}
		return fmt.Errorf("--output %s: %s has no CI output (github and gitlab are for %s); use text or json", output, path, strings.Join(ciCommands, ", "))
	}
	return fmt.Errorf("--output %q: must be text or json (or github or gitlab for %s)", output, strings.Join(ciCommands, ", "))
}

// ciFlag names a flag for a user who may have set it through an input of
// the GitHub Action or a GitLab component: "--spec (GPUPASS_SPEC, the
// spec input)" with a CI output format, else "--spec".
func ciFlag(g *GlobalOptions, flag string) string {
	kind, ok := ciOutput(g)
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
	ci.GitHub: {"region": "regions", "command": "train-command"},
}

// ciFlagNames are names (field -> "--flag") with each plain flag named as
// ciFlag names it when output is a CI output format: a library's error
// then tells a pipeline's author the input to set.
func ciFlagNames(names fielderr.Names, output string) fielderr.Names {
	g := &GlobalOptions{Output: output}
	if _, ok := ciOutput(g); !ok {
		return names
	}
	plain := regexp.MustCompile(`^--([a-z0-9-]+)$`)
	ci := make(fielderr.Names, len(names))
	for field, name := range names {
		if m := plain.FindStringSubmatch(name); m != nil {
			name = ciFlag(g, m[1])
		}
		ci[field] = name
	}
	return ci
}
