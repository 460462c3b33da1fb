package gpupass

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/flagenv"
)

// EnvPrefix is the prefix of every environment variable gpupass reads for
// its flags (package flagenv holds the rule for all three binaries).
const EnvPrefix = flagenv.Prefix

// EnvName returns the environment variable that sets a flag.
func EnvName(flag string) string { return flagenv.Name(flag) }

// MarkSecret declares a flag as a secret (token, password). Call it from
// the options' AddFlags.
func MarkSecret(flag string) { flagenv.MarkSecret(flag) }

func isSecret(flag string) bool { return flagenv.IsSecret(flag) }

// applyEnv sets every flag of cmd (and its parents' persistent flags) that
// was not given on the command line from its environment variable, then
// masks every secret in CI logs.
// all builds the whole command tree when cmd's holds only the command
// that runs (nil: cmd's is whole).
func applyEnv(cmd *cobra.Command, getenv func(string) string, all func() *cobra.Command) error {
	firstErr := flagenv.Apply(cmd, getenv)
	warnEnvTypos(cmd, os.Environ(), all)
	// Mask every secret before the command can print anything, whether it
	// came from the command line, GPUPASS_<FLAG> or GPUPASS_<FLAG>_FILE.
	env := ci.Detect(getenv, cmd.ErrOrStderr())
	mask := func(f *pflag.Flag) {
		if isSecret(f.Name) && f.Changed {
			env.Mask(f.Value.String())
		}
	}
	cmd.Flags().VisitAll(mask)
	cmd.InheritedFlags().VisitAll(mask)
	return firstErr
}

// ApplyEnv sets cmd's unset flags from their GPUPASS_* variables. The other
// binaries (gpupass-broker) call it so every flag follows the same rule.
func ApplyEnv(cmd *cobra.Command) error { return applyEnv(cmd, os.Getenv, nil) }

// warnEnvTypos warns on stderr about each GPUPASS_* variable that is close
// to, but not, one this binary reads: a typo would otherwise be ignored
// without a word. Known are the variables of every flag of every command
// (the same shell may serve several), and GPUPASS_<FLAG>_FILE of secrets.
// When cmd's tree is partial (all is not nil) and every GPUPASS_*
// variable is one of its own, nothing can be a typo and the whole tree is
// not built.
func warnEnvTypos(cmd *cobra.Command, environ []string, all func() *cobra.Command) {
	if !flagenv.Unknown(environ, nil) {
		return // no GPUPASS_* variable that could be a typo: skip the walk
	}
	root := cmd.Root()
	known := flagVars(root)
	if all != nil && flagenv.Unknown(environ, known) {
		root = all()
		known = flagVars(root)
	}
	for _, w := range flagenv.Typos(environ, known) {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: warning: %s\n", root.Name(), w)
	}
}

// flagVars are the environment variables of every flag in root's tree.
func flagVars(root *cobra.Command) map[string]bool {
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	add := func(f *pflag.Flag) {
		if !flagenv.HasEnv(f) {
			return
		}
		known[flagenv.Name(f.Name)] = true
		if isSecret(f.Name) {
			known[flagenv.Name(f.Name)+"_FILE"] = true
		}
	}
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(add)
		c.PersistentFlags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return known
}
