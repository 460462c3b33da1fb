package broker

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
)

// A region of many nodes, each excluded for its own reason (a report's
// free text among them): the run's reason names the most common first,
// stays within maxNoCandidateBytes, and says how many it left out and
// how to see them all.
func TestNoCandidateReasonIsBounded(t *testing.T) {
	t.Parallel()
	var out match.Output
	for i := range 200 {
		n := store.Node{ID: fmt.Sprintf("agt-%016x", i)}
		n.Labels.Region = "us-west-2"
		msg := fmt.Sprintf("failed check slurm.node: drained by admin %d %s", i, strings.Repeat("x", 500))
		if i%2 == 0 {
			msg = "runtime.pytorch: expected 2.1.0+cu121, measured 2.1.2+cu121"
		}
		out.Excluded = append(out.Excluded, &match.Result{Node: n, Reasons: []match.Reason{{Message: msg}}})
	}
	got := noCandidate(store.Alloc{Region: "us-west-2"}, out)
	if len(got) > maxNoCandidateBytes {
		t.Errorf("reason of %d bytes, want at most %d", len(got), maxNoCandidateBytes)
	}
	for _, want := range []string{
		"no candidate node in us-west-2 (200 node(s) excluded): runtime.pytorch: expected 2.1.0+cu121, measured 2.1.2+cu121 (100 nodes: agt-0000000000000000, agt-0000000000000002, agt-0000000000000004, …)",
		"drained by admin 1 xxx",
		"more reason(s), which a dry run of the spec in us-west-2 counts",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("reason lacks %q:\n%s", want, got)
		}
	}
}
