package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Not parallel: it replaces geteuid, which parallel tests' Validate reads.
func TestSlurmRunAsRangeNeedsRoot(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	geteuid = func() int { return 1000 }
	for _, o := range []*Options{
		{StorageClass: "standard", SuiteInterval: time.Hour, Executor: ExecutorSlurm, RunAsRange: "281000-281001"},
		{StorageClass: "standard", SuiteInterval: time.Hour, Executor: ExecutorSlurm, RunAs: "nobody"},
	} {
		err := o.Validate(false)
		var fe *fielderr.Error
		if !errors.As(err, &fe) || (fe.Field != executor.FieldUIDRange && fe.Field != executor.FieldRunAs) ||
			!strings.Contains(err.Error(), "needs the agent to run as root (it runs as uid 1000) on the login node: Slurm lets only root or its SlurmUser submit a job as another uid (sbatch --uid)") {
			t.Errorf("Validate as uid 1000 with --executor slurm = %v, want the root requirement with Slurm's reason", err)
		}
	}
	// The local executor's message says nothing of Slurm.
	o := &Options{StorageClass: "standard", SuiteInterval: time.Hour, RunAsRange: "281000-281001"}
	if err := o.Validate(false); err == nil || strings.Contains(err.Error(), "Slurm") {
		t.Errorf("Validate as uid 1000, local executor = %v, want the root requirement alone", err)
	}
}

// sbatch --uid takes only accounts the cluster's nodes know: a range of
// bare uids is refused at the agent's start, naming the uid and the fix.
func TestSlurmJobUsersMustBeAccounts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{RunAsRange: "281000-281001"}, "uid 281000 is no account here"},
		// daemon and bin (uids and groups 1 and 2) on every Debian.
		{Options{RunAsRange: "1-2"}, ""},
		{Options{RunAsRange: "1-2:65534"}, ""},
	} {
		r, err := executor.ParseUIDRange(c.o.RunAsRange)
		if err != nil {
			t.Fatal(err)
		}
		c.o.runAsRange = r
		err = c.o.checkSlurmJobUsers()
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want accepted", c.o.RunAsRange, err)
			}
			continue
		}
		var fe *fielderr.Error
		if !errors.As(err, &fe) || fe.Field != executor.FieldUIDRange || fe.Value != c.o.RunAsRange || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "on every compute node") {
			t.Errorf("%s: %v, want a %q field error that says %q", c.o.RunAsRange, err, executor.FieldUIDRange, c.want)
		}
	}
}
