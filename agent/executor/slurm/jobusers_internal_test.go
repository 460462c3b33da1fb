package slurm

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// sbatch --uid takes only accounts the cluster's nodes know: a range of
// bare uids is refused at the agent's start, naming the uid and the fix.
func TestSlurmJobUsersMustBeAccounts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		spec string
		want string
	}{
		{"281000-281001", "uid 281000 is no account here"},
		// daemon and bin (uids and groups 1 and 2) on every Debian.
		{"1-2", ""},
		{"1-2:65534", ""},
	} {
		r, err := local.ParseUIDRange(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		err = checkJobUsers(nil, r, "", c.spec)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want accepted", c.spec, err)
			}
			continue
		}
		var fe *fielderr.Error
		if !errors.As(err, &fe) || fe.Field != executor.FieldUIDRange || fe.Value != c.spec || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "on every compute node") {
			t.Errorf("%s: %v, want a %q field error that says %q", c.spec, err, executor.FieldUIDRange, c.want)
		}
	}
}

// The Slurm backend says why root, not Slurm's SlurmUser, starts jobs as
// other users (gpupass-agent puts it in the --run-as error).
func TestRootReason(t *testing.T) {
	t.Parallel()
	if r := Backend().(interface{ RootReason() string }).RootReason(); !strings.Contains(r, "on the login node: Slurm lets only root or its SlurmUser submit a job as another uid (sbatch --uid)") {
		t.Errorf("RootReason = %q", r)
	}
}
