package gpupass

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/localstack"
)

// upArgs parses args as up's flags (with the executors gpupass was built
// with), checks them as up does, and returns the argv of the agent of
// region "r", as up would start it with stack dir /state.
func upArgs(t *testing.T, args []string, env map[string]string) ([]string, error) {
	t.Helper()
	o := &UpOptions{}
	cmd := &cobra.Command{Use: "up"}
	o.AddFlags(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	if err := o.Executor.validate(o.AgentsPerRegion, func(k string) string { return env[k] }); err != nil {
		return nil, err
	}
	return localstack.AgentArgs(localstack.Options{Executor: o.Executor.Name, ExecutorArgs: o.Executor.args(), Profile: o.Profile, Python: o.Python},
		"http://127.0.0.1:1", "r", "agent-r-1", "/state")
}

// TestUpSlurmArgs: --executor slurm gives each region's agent the slurm
// flags the user set, as the agent's own, and the stack's dir, where the
// agent places the region's shared dir and the one ledger (slurm's
// TestInStack, which also refuses a shared dir that is no absolute
// directory here); the stack's rules are up's, naming the flag. The
// flags are the agent's slurm executor's, which gpupass does not link.
func TestUpSlurmArgs(t *testing.T) {
	t.Parallel()
	shared := t.TempDir()
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		want    []string // in order, somewhere in the argv
		not     []string
	}{
		{name: "local", args: []string{"--agents-per-region", "2"}, want: []string{"--executor", "local", "--stack-dir", "/state"}, not: []string{"--slurm-shared-dir"}},
		{name: "slurm", args: []string{"--executor", "slurm", "--slurm-partition", "gpu", "--slurm-partition", "big", "--slurm-shared-dir", shared, "--slurm-refresh", "2s"},
			want: []string{"--query-addr", "127.0.0.1:0", "--slurm-partition=gpu", "--slurm-partition=big", "--slurm-refresh=2s", "--slurm-shared-dir=" + shared}},
		{name: "slurm, unset flags left to the agent", args: []string{"--executor", "slurm", "--slurm-shared-dir", shared},
			want: []string{"--slurm-shared-dir=" + shared}, not: []string{"--slurm-refresh=30s", "--slurm-partition="}},
		// Any other executor the agent has (localstack checks the name
		// against gpupass-agent executors as the stack starts).
		{name: "another executor", args: []string{"--executor", "pbs", "--agents-per-region", "2"}, want: []string{"--executor", "pbs", "--stack-dir", "/state"}, not: []string{"--slurm-shared-dir"}},
		{name: "slurm flags with another executor", args: []string{"--executor", "pbs", "--slurm-shared-dir", shared}, wantErr: "--slurm-shared-dir needs --executor slurm"},
		{name: "slurm flags without slurm", args: []string{"--slurm-shared-dir", shared, "--slurm-partition", "gpu"}, wantErr: "--slurm-partition, --slurm-shared-dir need --executor slurm"},
		// One from the environment may be meant for another stack: the
		// agents inherit it, and a local agent ignores it.
		{name: "slurm variable without slurm", args: nil, env: map[string]string{"GPUPASS_SLURM_SHARED_DIR": shared}, want: []string{"--executor", "local"}},
		{name: "two agents per region", args: []string{"--executor", "slurm", "--slurm-shared-dir", shared, "--agents-per-region", "2"},
			wantErr: "--agents-per-region 2: with --executor slurm each region has one agent, which stands for every compute node"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args, err := upArgs(t, tt.args, tt.env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("up %q = %v, want an error with %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			joined := " " + strings.Join(args, " ") + " "
			if !strings.Contains(joined, " "+strings.Join(tt.want, " ")+" ") {
				t.Errorf("argv %q lacks %q", args, tt.want)
			}
			for _, n := range tt.not {
				if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, n) }) {
					t.Errorf("argv %q has %s", args, n)
				}
			}
		})
	}
}

// TestUpHelpGroupsExecutorFlags: up --help lists its own flags first and
// then each executor's under a heading of its own, every flag of the
// agent's executors included (gpupass links none of them).
func TestUpHelpGroupsExecutorFlags(t *testing.T) {
	t.Parallel()
	var out, errw bytes.Buffer
	if code := Main(context.Background(), []string{"up", "--help"}, strings.NewReader(""), &out, &errw); code != 0 {
		t.Fatalf("up --help: exit %d %s", code, errw.String())
	}
	help := out.String()
	own, rest, ok := strings.Cut(help, "\nFlags of --executor ")
	if !ok || regexp.MustCompile(`(?m)^ +--(slurm|kube)`).MatchString(own) || !strings.Contains(own, "--agents-per-region") {
		t.Fatalf("up --help does not keep the executors' flags apart from its own:\n%s", help)
	}
	for _, group := range []struct{ heading, flag string }{
		{"Flags of --executor slurm (gpupass-agent's own, passed to each region's agent):", "--slurm-simulate strings"},
		{"Flags of --executor kubernetes (gpupass-agent's own, passed to each region's agent):", `--kube-namespace string       with --executor kubernetes: namespace of the runs' and conformance checks' Jobs (default "default")`},
	} {
		_, after, ok := strings.Cut("\nFlags of --executor "+rest, "\n"+group.heading+"\n")
		section, _, _ := strings.Cut(after, "\n\n")
		if !ok || !strings.Contains(section, group.flag) {
			t.Errorf("up --help has no %q with %q:\n%s", group.heading, group.flag, help)
		}
	}
}

// TestUpRefusesABadPublicURL: up checks --public-url before it starts
// anything, with the fix in the message, exit 2.
func TestUpRefusesABadPublicURL(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"gpupass.example.com", "ftp://gpupass.example.com", "https://"} {
		var out, errw bytes.Buffer
		code := Main(context.Background(), []string{"up", "--state-dir", t.TempDir(), "--public-url", bad}, strings.NewReader(""), &out, &errw)
		if code != 2 || !strings.Contains(errw.String(), "--public-url") || !strings.Contains(errw.String(), "e.g. https://gpupass.example.com") {
			t.Errorf("up --public-url %q: exit %d, stderr %q; want 2 and the fix", bad, code, errw.String())
		}
	}
}
