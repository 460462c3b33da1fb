package agent

import (
	"errors"
	"strings"
	"testing"
)

// A run followed on after a restart whose uid another run may hold now
// is no proof: one that would have succeeded fails, disputed; one that
// failed keeps its own reason, and a reclaimed uid changes nothing.
func TestDisputeUnclaimed(t *testing.T) {
	t.Parallel()
	lost := errors.New("uid 200001 is held by another run or spoiled")
	ok := AllocUpdate{State: StateSucceeded}
	disputeUnclaimed(&ok, nil)
	if ok.State != StateSucceeded {
		t.Errorf("reclaimed uid: %v %q, want succeeded", ok.State, ok.Reason)
	}
	won := AllocUpdate{State: StateSucceeded}
	disputeUnclaimed(&won, lost)
	if won.State != StateFailed || !strings.HasPrefix(won.Reason, "disputed: ") || !strings.Contains(won.Reason, lost.Error()) {
		t.Errorf("uid not reclaimed: %v %q, want failed, disputed, naming why", won.State, won.Reason)
	}
	failed := AllocUpdate{State: StateFailed, Reason: "exit status 3"}
	disputeUnclaimed(&failed, lost)
	if failed.Reason != "exit status 3" {
		t.Errorf("a failed run's reason became %q", failed.Reason)
	}
}
