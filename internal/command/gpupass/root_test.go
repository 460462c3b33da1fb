package gpupass

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// fakeCommand stands for auditcmd's and bundlecmd's Command, whose
// packages import this one (so its tests cannot import them): a command
// tree named name.
func fakeCommand(name string) Subcommand {
	return Subcommand{Name: name, New: func(*GlobalOptions) *cobra.Command {
		return &cobra.Command{Use: name, Short: "the " + name + " commands", RunE: func(*cobra.Command, []string) error { return nil }}
	}}
}

// withPlugins links fake audit and bundle trees in, as cmd/gpupass links
// the real ones.
var withPlugins = []Option{WithCommands(fakeCommand("audit"), fakeCommand("bundle"))}

// everyCommand is every top-level command of gpupass, the linked ones too.
func everyCommand() []string {
	var names []string
	for _, c := range newRootConfig(withPlugins).commands {
		names = append(names, c.Name)
	}
	return names
}

// TestCommandNames keeps the table's names the ones the commands answer
// to: a wrong name would send that command to the whole tree every time,
// or (were another command given it) to the wrong one.
func TestCommandNames(t *testing.T) {
	t.Parallel()
	g := &GlobalOptions{}
	for _, c := range newRootConfig(withPlugins).commands {
		if got := c.New(g).Name(); got != c.Name {
			t.Errorf("commands entry %q builds a command named %q", c.Name, got)
		}
	}
}

// TestRootForBuildsOnlyTheCommandRun: a process builds the subtree of the
// command it runs, and the whole tree where cobra needs it (help,
// completion, a misspelt command it suggests a fix for).
func TestRootForBuildsOnlyTheCommandRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want []string // the root's subcommands; nil: all of them
	}{
		{args: []string{"validate", "--spec", "x.yaml"}, want: []string{"validate"}},
		{args: []string{"-o", "json", "version"}, want: []string{"version"}},
		{args: []string{"--output", "json", "runs", "--limit", "3"}, want: []string{"runs"}},
		{args: []string{"--output=json", "-v", "nodes"}, want: []string{"nodes"}},
		// cobra itself finds no command here (it takes "json" for one).
		{args: []string{"-vo", "json", "ci", "step", "train"}},
		{args: []string{"-ojson", "validate"}, want: []string{"validate"}},
		{args: []string{"validate", "--help"}, want: []string{"validate"}},
		{args: []string{"audit", "alloc-1"}, want: []string{"audit"}},
		{args: []string{"bundle", "push"}, want: []string{"bundle"}},
		{args: nil},
		{args: []string{"--help"}},
		{args: []string{"help", "validate"}},
		{args: []string{"completion", "bash"}},
		{args: []string{"__complete", "val"}},
		{args: []string{"valdate"}},
		{args: []string{"-o", "validate"}},
		{args: []string{"--", "validate"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			root := rootFor(newRootConfig(withPlugins), tt.args)
			want := tt.want
			if want == nil {
				want = everyCommand()
			}
			if diff := cmp.Diff(sortedNames(want), subcommandNames(root)); diff != "" {
				t.Errorf("subcommands built (-want +got):\n%s", diff)
			}
		})
	}
}

func subcommandNames(root *cobra.Command) []string {
	var names []string
	for _, c := range root.Commands() {
		names = append(names, c.Name())
	}
	return sortedNames(names)
}

func sortedNames(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return out
}

// TestHelpAndCompletionListEveryCommand: with the tree built lazily,
// `gpupass --help`, `gpupass help` and shell completion (the script's
// `gpupass __complete`) still offer every command.
func TestHelpAndCompletionListEveryCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"help"}, nil, {"__complete", ""}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), args, strings.NewReader(""), &stdout, &stderr, withPlugins...); code != ExitOK {
				t.Fatalf("exit %d, stderr: %s", code, stderr.String())
			}
			for _, name := range append(everyCommand(), "completion") {
				if !hasCommandLine(stdout.String(), name) {
					t.Errorf("output lists no %q:\n%s", name, stdout.String())
				}
			}
		})
	}
	// The bash script itself asks gpupass (`__complete`) for the names.
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"completion", "bash"}, strings.NewReader(""), &stdout, &stderr); code != ExitOK {
		t.Fatalf("completion bash: exit %d, stderr: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "__complete") {
		t.Errorf("completion bash: the script does not call __complete:\n%.400s", stdout.String())
	}
}

// hasCommandLine says whether out has a line listing name: help's
// "  name   Short", or completion's "name\tShort" or "name".
func hasCommandLine(out, name string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == name {
			return true
		}
	}
	return false
}

// TestEnvTypoCheckSeesEveryCommand: a process runs with only its own
// command built, yet a variable of another command's flag is known (no
// warning) and a misspelling of one is still caught.
func TestEnvTypoCheckSeesEveryCommand(t *testing.T) {
	tests := []struct {
		name, env, want string
	}{
		{name: "another command's flag", env: "GPUPASS_BROKER_URL"},
		{name: "misspelt", env: "GPUPASS_BROKR_URL", want: "GPUPASS_BROKR_URL is not a gpupass setting and is ignored; did you mean GPUPASS_BROKER_URL?"},
		{name: "one of its own", env: "GPUPASS_OUTPUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(tt.env, "text")
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), []string{"version"}, strings.NewReader(""), &stdout, &stderr)
			if code != ExitOK {
				t.Fatalf("exit %d, stderr: %s", code, stderr.String())
			}
			switch {
			case tt.want == "" && stderr.Len() > 0:
				t.Errorf("unexpected warning: %s", stderr.String())
			case tt.want != "" && !strings.Contains(stderr.String(), tt.want):
				t.Errorf("stderr lacks %q: %s", tt.want, stderr.String())
			}
		})
	}
}

// Issue #34: every rank of a gang's job has GPUPASS_RANK, GPUPASS_MASTER_ADDR
// and the rest of the rendezvous in its environment. No flag of gpupass
// reads one of them, or a `gpupass logs RUN` run in a job would quietly
// show only that job's rank; and a command run there warns about none.
func TestNoFlagReadsTheRendezvous(t *testing.T) {
	rdv := map[string]bool{}
	for _, n := range rendezvous.Names() {
		rdv[n] = true
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if flagenv.HasEnv(f) && rdv[flagenv.Name(f.Name)] {
				t.Errorf("%s --%s is set by %s, which every rank of a gang's job has (the rendezvous): mark it flagenv.NoEnv", c.CommandPath(), f.Name, flagenv.Name(f.Name))
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRoot())

	// In a rank's environment, `gpupass logs --rank` is left to the
	// command line, and no rendezvous variable is taken for a typo.
	cmd := NewRoot()
	logs, _, err := cmd.Find([]string{"logs"})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GPUPASS_RANK": "1", "GPUPASS_LOCAL_RANK": "0", "GPUPASS_NODE_RANK": "1"}
	if err := flagenv.Apply(logs, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if f := logs.Flags().Lookup("rank"); f.Changed || f.Value.String() != "" {
		t.Errorf("gpupass logs --rank is %q (changed %v) with GPUPASS_RANK=1 in the environment, want it unset: every rank", f.Value, f.Changed)
	}
	var environ []string
	for _, n := range rendezvous.Names() {
		environ = append(environ, n+"=1")
	}
	if w := flagenv.Typos(environ, flagVars(NewRoot())); len(w) > 0 {
		t.Errorf("a gpupass command in a gang's job warns: %q", w)
	}
}

// TestLogsRankFlag: `gpupass logs --rank` left out means every rank, and
// its help says so with no number standing for "none"; a rank is 0 or
// more, and anything else is refused naming the flag and what to give.
func TestLogsRankFlag(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"logs", "--help"}, strings.NewReader(""), &stdout, &stderr); code != ExitOK {
		t.Fatalf("logs --help: exit %d, stderr: %s", code, stderr.String())
	}
	var line string
	for _, l := range strings.Split(stdout.String(), "\n") {
		if strings.Contains(l, "--rank ") {
			line = l
		}
	}
	if !strings.Contains(line, "--rank int") || !strings.Contains(line, "default every rank") || strings.Contains(line, "(default") {
		t.Errorf("logs --help's --rank line: %q; want it to say every rank is the default, with no default value", line)
	}
	for _, tc := range []struct {
		arg  string
		want *int
		err  string
	}{
		{"", nil, ""},
		{"0", new(int), ""},
		{"-1", nil, `invalid argument "-1" for "--rank" flag: want a rank: 0 (the run's own), 1, …; leave --rank out for every rank`},
		{"one", nil, `invalid argument "one" for "--rank" flag: want a rank`},
	} {
		o := &LogsOptions{}
		cmd := &cobra.Command{Use: "logs", RunE: func(*cobra.Command, []string) error { return nil }}
		o.AddFlags(cmd)
		args := []string{}
		if tc.arg != "" {
			args = append(args, "--rank", tc.arg)
		}
		err := cmd.ParseFlags(args)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("--rank %s: %v, want an error %q", tc.arg, err, tc.err)
			}
		case err != nil:
			t.Errorf("--rank %q: %v", tc.arg, err)
		case (o.Rank == nil) != (tc.want == nil) || o.Rank != nil && *o.Rank != *tc.want:
			t.Errorf("--rank %q: Rank %v, want %v", tc.arg, o.Rank, tc.want)
		}
	}
}
