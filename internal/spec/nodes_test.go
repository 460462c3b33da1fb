package spec

import (
	"strings"
	"testing"
)

// TestNodesFindings: a bad resources.nodes is named with its file, line
// and field, says what is wrong and how to fix it; a good one is valid
// and kept, and leaving it out leaves it 0 (the broker's choice).
func TestNodesFindings(t *testing.T) {
	t.Parallel()
	const head = "name: x\nruntime:\n  cuda: 12.1.105\n  nvidia-driver: 535.104.05\n  python: 3.10.12\n  pytorch: 2.1.2+cu121\nresources:\n  accelerator: a100-80gb\n"
	for _, tc := range []struct {
		name, res     string
		want, wantFix string // "" for valid
		wantNodes     int
		line, column  int
	}{
		{"two nodes of four", "  count: 8\n  nodes: 2\n", "", "", 2, 0, 0},
		{"one node", "  count: 8\n  nodes: 1\n", "", "", 1, 0, 0},
		{"left out", "  count: 8\n", "", "", 0, 0, 0},
		{"not divisible", "  count: 8\n  nodes: 3\n", "resources.count 8 is not divisible by resources.nodes 3: every node of a run takes the same number of GPUs",
			"make it a multiple of 3 (e.g. 9), or set nodes to one of 1, 2, 4 or 8", 0, 10, 10},
		{"more nodes than GPUs", "  count: 2\n  nodes: 4\n", "resources.count 2 is not divisible by resources.nodes 4", "set nodes to one of 1 or 2", 0, 10, 10},
		{"count left out is 1", "  nodes: 2\n", "resources.count 1 is not divisible by resources.nodes 2", "set nodes to one of 1", 0, 9, 10},
		{"zero", "  count: 8\n  nodes: 0\n", "resources.nodes is 0; it must be 1 to 1024", "leave nodes out to let the broker choose the fewest", 0, 10, 10},
		{"negative", "  count: 8\n  nodes: -2\n", "resources.nodes is -2; it must be 1 to 1024", "", 0, 10, 10},
		{"too many", "  count: 2048\n  nodes: 2048\n", "resources.nodes is 2048; it must be 1 to 1024", "", 0, 10, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := Validate("gpupass.yaml", []byte(head+tc.res))
			if tc.want == "" {
				if !res.Valid {
					t.Fatalf("not valid: %+v", res.Findings)
				}
				if res.Spec.Resources.Nodes != tc.wantNodes {
					t.Errorf("nodes %d, want %d", res.Spec.Resources.Nodes, tc.wantNodes)
				}
				return
			}
			if res.Valid {
				t.Fatalf("valid, want %q", tc.want)
			}
			var f *Finding
			for i := range res.Findings {
				if res.Findings[i].Rule == "resources.nodes" {
					f = &res.Findings[i]
				}
			}
			if f == nil {
				t.Fatalf("no resources.nodes finding: %+v", res.Findings)
			}
			if f.File != "gpupass.yaml" || f.Path != "resources.nodes" || f.Line != tc.line || f.Column != tc.column ||
				!strings.Contains(f.Message, tc.want) || !strings.Contains(f.Fix, tc.wantFix) {
				t.Errorf("finding %+v\nwant gpupass.yaml:%d:%d resources.nodes %q, fix containing %q", *f, tc.line, tc.column, tc.want, tc.wantFix)
			}
		})
	}
}
