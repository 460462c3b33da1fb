package match

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
)

// TestIndexSharesReasons: a thousand nodes with the same mismatch share one
// reason, nodes with different measured values get their own, and equal
// scores order by node id.
func TestIndexSharesReasons(t *testing.T) {
	t.Parallel()
	var nodes []store.Node
	for i := 999; i >= 0; i-- { // ids in reverse: order must come from sorting
		n := node(fmt.Sprintf("n%04d", i), "us-west-2", "h100-sxm5", 8, 30, 10)
		if i%2 == 1 {
			n.Index.Runtime.CUDA = "12.2.140"
		}
		if i%10 == 1 {
			n.Index.Runtime.CUDA = "12.3.52"
		}
		nodes = append(nodes, n)
	}
	ix := Prepare(nodes, nil)
	vs := ix.Match(Query{Spec: testSpec(), Scope: []string{"*"}, MinScore: 85, Now: now, OfflineAfter: time.Minute})
	if len(vs.Candidates) != 500 || len(vs.Excluded) != 500 {
		t.Fatalf("%d candidates, %d excluded; want 500 and 500", len(vs.Candidates), len(vs.Excluded))
	}
	var measured []string
	for _, r := range vs.Reasons {
		measured = append(measured, r.Code+" "+r.Field+" "+r.Measured)
	}
	if diff := cmp.Diff([]string{"runtime_mismatch runtime.cuda 12.2.140", "runtime_mismatch runtime.cuda 12.3.52"}, measured); diff != "" {
		t.Errorf("distinct reasons (-want +got):\n%s", diff)
	}
	for _, v := range vs.Excluded {
		n := ix.Node(v.Node)
		if len(v.Reasons) != 1 || vs.Reasons[v.Reasons[0]].Measured != n.Index.Runtime.CUDA {
			t.Fatalf("%s: reasons %v, want its own cuda %s", n.ID, v.Reasons, n.Index.Runtime.CUDA)
		}
	}
	for i, v := range vs.Candidates {
		if want := fmt.Sprintf("n%04d", 2*i); ix.Node(v.Node).ID != want {
			t.Fatalf("candidate %d is %s, want %s (equal scores order by id)", i, ix.Node(v.Node).ID, want)
		}
	}
}

// TestPermute: every verdict lands where dest says, whatever the cycles
// of the permutation (identity, one long cycle, swaps, reversal).
func TestPermute(t *testing.T) {
	t.Parallel()
	tests := map[string][]int32{
		"empty":    {},
		"identity": {0, 1, 2, 3},
		"cycle":    {1, 2, 3, 4, 0},
		"swaps":    {1, 0, 3, 2, 4},
		"reverse":  {5, 4, 3, 2, 1, 0},
		"mixed":    {2, 0, 1, 5, 3, 4, 6},
	}
	for name, dest := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			vs := make([]Verdict, len(dest))
			want := make([]Verdict, len(dest))
			for i, d := range dest {
				vs[i] = Verdict{Node: int32(i), Reasons: []int32{int32(i)}}
				want[d] = vs[i]
			}
			permute(vs, slices.Clone(dest))
			if diff := cmp.Diff(want, vs); diff != "" {
				t.Errorf("permute(%v) (-want +got):\n%s", dest, diff)
			}
		})
	}
}
