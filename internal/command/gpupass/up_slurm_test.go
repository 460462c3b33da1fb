package gpupass

import (
	"github.com/gpupass/gpupass/internal/app/localstack"
	"slices"
	"strings"
	"testing"
)

// TestUpSlurmArgs: --executor slurm gives each region's agent the slurm
// flags and the stack's dir, where the agent places the region's shared
// dir and the one ledger (slurm's TestInStack); bad combinations are refused naming
// the flag.
func TestUpSlurmArgs(t *testing.T) {
	t.Parallel()
	shared := t.TempDir()
	for _, tt := range []struct {
		name    string
		slurm   UpSlurm
		per     int
		wantErr string
		want    []string // in order, somewhere in the argv
		not     []string
	}{
		{name: "local", slurm: UpSlurm{Executor: "local"}, per: 2, want: []string{"--executor", "local", "--stack-dir", "/state"}, not: []string{"--slurm-shared-dir"}},
		{name: "slurm", slurm: UpSlurm{Executor: "slurm", Partitions: []string{"gpu", "big"}, SharedDir: shared}, per: 1,
			want: []string{"--query-addr", "127.0.0.1:0", "--slurm-shared-dir", shared, "--slurm-partition", "gpu", "--slurm-partition", "big"}},
		// Any other executor the agent has (localstack checks the name
		// against gpupass-agent executors as the stack starts).
		{name: "another executor", slurm: UpSlurm{Executor: "fake"}, per: 2, want: []string{"--executor", "fake", "--stack-dir", "/state"}, not: []string{"--slurm-shared-dir"}},
		{name: "slurm flags with another executor", slurm: UpSlurm{Executor: "fake", SharedDir: shared}, per: 1, wantErr: "need --executor slurm"},
		{name: "slurm flags without slurm", slurm: UpSlurm{SharedDir: shared}, per: 1, wantErr: "need --executor slurm"},
		{name: "relative shared dir", slurm: UpSlurm{Executor: "slurm", SharedDir: "scratch"}, per: 1, wantErr: "--slurm-shared-dir \"scratch\""},
		{name: "two agents per region", slurm: UpSlurm{Executor: "slurm", SharedDir: shared}, per: 2, wantErr: "--agents-per-region 2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := &UpOptions{Slurm: tt.slurm, Profile: "a100-80gb-4x", Python: "/usr/bin/python3"}
			err := o.Slurm.validate(tt.per)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("validate = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			args, err := localstack.AgentArgs(localstack.Options{Executor: o.Slurm.Executor, ExecutorArgs: o.Slurm.args(), Profile: o.Profile, Python: o.Python},
				"http://127.0.0.1:1", "hpc", "agent-hpc-1", "/state")
			if err != nil {
				t.Fatal(err)
			}
			joined := " " + strings.Join(args, " ") + " "
			if !strings.Contains(joined, " "+strings.Join(tt.want, " ")+" ") {
				t.Errorf("argv %q lacks %q", args, tt.want)
			}
			for _, n := range tt.not {
				if slices.Contains(args, n) {
					t.Errorf("argv %q has %s", args, n)
				}
			}
		})
	}
}
