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
// An executor's reason for root (Backend RootReasoner, the Slurm one's in
// agent/executor/slurm) is in the job user's error; the local executor's
// says nothing more.
func TestRootReasonInJobUserErrors(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	geteuid = func() int { return 1000 }
	const why = "on the login node: the cluster lets only root submit as another uid"
	for _, o := range []*Options{
		{StorageClass: "standard", SuiteInterval: time.Hour, RootReason: why, RunAsRange: "281000-281001"},
		{StorageClass: "standard", SuiteInterval: time.Hour, RootReason: why, RunAs: "nobody"},
	} {
		err := o.Validate(false)
		var fe *fielderr.Error
		if !errors.As(err, &fe) || (fe.Field != executor.FieldUIDRange && fe.Field != executor.FieldRunAs) ||
			!strings.Contains(err.Error(), "needs the agent to run as root (it runs as uid 1000) "+why+"; run the agent as root") {
			t.Errorf("Validate as uid 1000 with a reason = %v, want the root requirement with the executor's reason", err)
		}
	}
	o := &Options{StorageClass: "standard", SuiteInterval: time.Hour, RunAsRange: "281000-281001"}
	if err := o.Validate(false); err == nil || !strings.Contains(err.Error(), "(it runs as uid 1000); run the agent as root") {
		t.Errorf("Validate as uid 1000, local executor = %v, want the root requirement alone", err)
	}
}
