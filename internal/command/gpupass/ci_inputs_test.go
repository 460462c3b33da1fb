package gpupass_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/auditcmd"
	"github.com/gpupass/gpupass/internal/command/gpupass/bundlecmd"
	"github.com/gpupass/gpupass/internal/command/gpupass/modelcmd"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/command/registryflags"
)

// TestCIInputsMatchFlags holds the action and the GitLab templates to the
// CLI: every GPUPASS_<NAME> they set must be a flag of the command they
// run (the action: of one of the commands its run step runs), or the
// value would be dropped without a word.
func TestCIInputsMatchFlags(t *testing.T) {
	t.Parallel()
	root := gpupass.NewRoot(gpupass.WithCommands(auditcmd.Command, bundlecmd.Command, modelcmd.Command), gpupass.WithPoster(forgepost.Poster{}))
	// Read by the action's scripts or by the ci package, not flags.
	always := map[string]bool{"GPUPASS_DOTENV": true, "GPUPASS_INSTALL_VERSION": true, "GPUPASS_ACTION_PATH": true, "GPUPASS_ACTION_REPOSITORY": true, "GPUPASS_ACTION_STEP": true}
	// flagsOf are the variables of the flags of the command a script line
	// runs ("gpupass -o gitlab train --follow").
	flagsOf := func(t *testing.T, line string) map[string]bool {
		t.Helper()
		args := strings.Fields(line)[1:]
		for len(args) > 0 && strings.HasPrefix(args[0], "-") {
			args = args[2:] // -o gitlab
		}
		cmd, _, err := root.Find(args)
		if err != nil || cmd == root {
			t.Fatalf("%q runs no gpupass command: %v", line, err)
		}
		known := map[string]bool{}
		add := func(f *pflag.Flag) { known[gpupass.EnvName(f.Name)] = true }
		cmd.Flags().VisitAll(add)
		cmd.InheritedFlags().VisitAll(add)
		if strings.HasPrefix(cmd.CommandPath(), "gpupass bundle") {
			// The registry flags' variables (bundlecmd reads them in CI).
			r := &cobra.Command{Use: "r"}
			(&registryflags.Flags{}).AddFlags(r.Flags())
			r.Flags().VisitAll(add)
		}
		if cmd.Flags().Lookup("model-ref") != nil {
			// --model-ref runs model push in-process, which reads its
			// own variables (the signing key, the signing config).
			push, _, err := root.Find([]string{"model", "push"})
			if err != nil {
				t.Fatal(err)
			}
			push.Flags().VisitAll(add)
		}
		return known
	}
	dir := filepath.Join("..", "..", "..")
	files, _ := filepath.Glob(filepath.Join(dir, "components", "gitlab", "templates", "*", "template.yml"))
	files = append(files, filepath.Join(dir, "action.yml"))
	if len(files) < 6 {
		t.Fatalf("found %d files", len(files))
	}
	vars := regexp.MustCompile(`(?m)^\s+(GPUPASS_[A-Z_]+):`)
	// A template's script, or an arm of the action's case.
	runs := regexp.MustCompile(`(?m)(?:^\s*script:\s*|\)\s*exec\s+)(gpupass [^;\n]*?)\s*(?:;;|$)`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		known := map[string]bool{}
		for _, m := range runs.FindAllStringSubmatch(string(b), -1) {
			for k := range flagsOf(t, m[1]) {
				known[k] = true
			}
		}
		if len(known) == 0 {
			t.Fatalf("%s runs no gpupass command", f)
		}
		for _, m := range vars.FindAllStringSubmatch(string(b), -1) {
			if !known[m[1]] && !always[m[1]] {
				t.Errorf("%s sets %s, which no flag of the command it runs reads", strings.TrimPrefix(f, dir+"/"), m[1])
			}
		}
	}
}

// TestOutputHelpNamesTheCICommands keeps -o's help, which lists the
// commands that print github and gitlab, the list of the commands that
// declare them (CICommand): the help is written by hand.
func TestOutputHelpNamesTheCICommands(t *testing.T) {
	t.Parallel()
	root := gpupass.NewRoot(gpupass.WithCommands(auditcmd.Command, bundlecmd.Command, modelcmd.Command), gpupass.WithPoster(forgepost.Poster{}))
	var ci []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root && slices.Contains(output.Supported(c), output.GitHub) {
			ci = append(ci, strings.TrimPrefix(c.CommandPath(), "gpupass "))
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	usage := root.PersistentFlags().Lookup(output.Flag).Usage
	_, list, _ := strings.Cut(usage, "for a CI step (")
	got := strings.Split(strings.TrimSuffix(list, ")"), ", ")
	slices.Sort(got)
	slices.Sort(ci)
	if diff := cmp.Diff(ci, got); diff != "" {
		t.Errorf("-o's help %q names other commands than those that print github (-declared, +in the help):\n%s", usage, diff)
	}
}

// TestLinkedCommandNames: the trees cmd/gpupass links in answer to the
// name they are linked under (TestCommandNames checks this package's).
func TestLinkedCommandNames(t *testing.T) {
	t.Parallel()
	for _, c := range []gpupass.Subcommand{auditcmd.Command, bundlecmd.Command, modelcmd.Command} {
		if got := c.New(&gpupass.GlobalOptions{}).Name(); got != c.Name {
			t.Errorf("Subcommand %q builds a command named %q", c.Name, got)
		}
	}
}

// TestErrorsNameTheInputsTheStepsSet holds the input an error names
// under -o github|gitlab (CIFlag, from a table kept by hand) to the input
// the action or the component really sets the flag from: its
// GPUPASS_<FLAG>: <input> line, or an argument --flag "$GPUPASS_<VAR>".
func TestErrorsNameTheInputsTheStepsSet(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "..")
	templates, _ := filepath.Glob(filepath.Join(dir, "components", "gitlab", "templates", "*", "template.yml"))
	if len(templates) < 5 {
		t.Fatalf("found %d templates", len(templates))
	}
	files := map[string]output.Format{filepath.Join(dir, "action.yml"): output.GitHub}
	for _, f := range templates {
		files[f] = output.GitLab
	}
	env := regexp.MustCompile(`(?m)^\s+GPUPASS_([A-Z_]+):\s*(?:\$\{\{|\$\[\[)\s*inputs\.([a-z0-9-]+)\s*(?:\}\}|\]\])`)
	arg := regexp.MustCompile(`--([a-z0-9-]+) "\$GPUPASS_([A-Z_]+)"`)
	flags := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { flags[f.Name] = true })
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(gpupass.NewRoot(gpupass.WithCommands(auditcmd.Command, bundlecmd.Command, modelcmd.Command), gpupass.WithPoster(forgepost.Poster{})))
	checked := 0
	for f, format := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inputOf := map[string]string{} // variable -> the input it is set from
		for _, m := range env.FindAllStringSubmatch(string(b), -1) {
			inputOf[m[1]] = m[2]
		}
		check := func(flag, input string) {
			t.Helper()
			checked++
			want := fmt.Sprintf("the %s input)", input)
			if got := gpupass.CIFlag(format, flag); !strings.HasSuffix(got, want) {
				t.Errorf("%s sets --%s from the %s input, but under -o %s an error names it %q", strings.TrimPrefix(f, dir+"/"), flag, input, format, got)
			}
		}
		for v, input := range inputOf {
			if flag := strings.ToLower(strings.ReplaceAll(v, "_", "-")); flags[flag] {
				check(flag, input) // not the install script's variables
			}
		}
		for _, m := range arg.FindAllStringSubmatch(string(b), -1) {
			if input, ok := inputOf[m[2]]; ok {
				check(m[1], input)
			}
		}
	}
	if checked < 30 {
		t.Fatalf("checked only %d inputs: the patterns no longer match the files", checked)
	}
}

// TestBadInputValueNamesTheInput: a step's input that sets a flag's
// variable to a value the flag refuses is named by the input under a CI
// format, with the values it takes, not by a variable the pipeline's
// author never wrote (wait: maybe was "invalid value "maybe" in
// GPUPASS_FOLLOW: strconv.ParseBool: parsing "maybe": invalid syntax").
// Secrets stay out of the message.
func TestBadInputValueNamesTheInput(t *testing.T) {
	tests := []struct {
		args          []string
		env, value    string
		want, notWant string
	}{
		{[]string{"-o", "github", "train"}, "GPUPASS_FOLLOW", "maybe",
			`invalid value "maybe" in --follow (GPUPASS_FOLLOW, the wait input): want true or false`, "strconv"},
		{[]string{"-o", "gitlab", "train"}, "GPUPASS_FOLLOW", "maybe",
			`invalid value "maybe" in --follow (GPUPASS_FOLLOW, the wait input): want true or false`, "strconv"},
		{[]string{"train"}, "GPUPASS_FOLLOW", "maybe", `invalid value "maybe" in GPUPASS_FOLLOW: want true or false`, "input"},
		{[]string{"-o", "github", "compare"}, "GPUPASS_FAIL_ON_DIVERGENCE", "perhaps",
			`invalid value "perhaps" in --fail-on-divergence (GPUPASS_FAIL_ON_DIVERGENCE, the fail-on-divergence input): want true or false`, ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Setenv(tt.env, tt.value)
			code, _, stderr := runMain(t, tt.args...)
			if code != 2 || !strings.Contains(stderr, tt.want) || (tt.notWant != "" && strings.Contains(stderr, tt.notWant)) {
				t.Errorf("%s=%s gpupass %s: exit %d, %q; want 2 and %q", tt.env, tt.value, strings.Join(tt.args, " "), code, stderr, tt.want)
			}
		})
	}
}
