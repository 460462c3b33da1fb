package match

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
)

// BenchmarkIndexMatch is the matching half of a dry-run at 10,000 and
// 100,000 nodes (the fixture of the broker's BenchmarkDryRun: six
// regions, one node in seven on another CUDA, one in five an A100),
// without the network; the verdicts are released as the broker does.
func BenchmarkIndexMatch(b *testing.B) {
	regions := []string{"us-west-2", "us-east-1", "eu-central-1", "eu-west-1", "ap-south-1", "ap-northeast-1"}
	for _, size := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("nodes=%d", size), func(b *testing.B) {
			nodes := make([]store.Node, size)
			for i := range nodes {
				n := node(fmt.Sprintf("agt-bench%06d", i), regions[i%len(regions)], "h100-sxm5", 8, 18+float64(i%13), float64(i%40))
				if i%7 == 0 {
					n.Index.Runtime.CUDA = "12.2.140"
				}
				if i%5 == 0 {
					n.Index.Accelerator, n.Index.GPUCount = "a100-80gb", 4
				}
				nodes[i] = n
			}
			ix := Prepare(nodes, nil)
			q := Query{Spec: testSpec(), Scope: []string{"*"}, MinScore: 85, Now: now, OfflineAfter: time.Minute}
			b.ReportAllocs()
			b.ResetTimer()
			candidates := 0
			for i := 0; i < b.N; i++ {
				vs := ix.Match(q)
				candidates = len(vs.Candidates)
				vs.Release()
			}
			b.ReportMetric(float64(candidates), "candidates")
		})
	}
}

// BenchmarkPrepare is the per-snapshot cost of indexing 10,000 nodes.
func BenchmarkPrepare(b *testing.B) {
	nodes := make([]store.Node, 10000)
	for i := range nodes {
		nodes[i] = node(fmt.Sprintf("agt-bench%06d", i), "us-west-2", "h100-sxm5", 8, 18+float64(i%13), float64(i%40))
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		Prepare(nodes, nil)
	}
}

// BenchmarkGangs is what gangs add to a dry-run of BenchmarkIndexMatch's
// fleet at 100,000 nodes, given the match the dry-run lists: nothing to
// find for count 8 without resources.nodes (every region has an 8-GPU
// node: one pass), and with nodes: 2 the gangs of 4-GPU shares and the
// reasons of the regions without one (no match of its own).
func BenchmarkGangs(b *testing.B) {
	regions := []string{"us-west-2", "us-east-1", "eu-central-1", "eu-west-1", "ap-south-1", "ap-northeast-1"}
	nodes := make([]store.Node, 100000)
	for i := range nodes {
		n := node(fmt.Sprintf("agt-bench%06d", i), regions[i%len(regions)], "h100-sxm5", 8, 18+float64(i%13), float64(i%40))
		if i%7 == 0 {
			n.Index.Runtime.CUDA = "12.2.140"
		}
		if i%5 == 0 {
			n.Index.Accelerator, n.Index.GPUCount = "a100-80gb", 4
		}
		nodes[i] = n
	}
	ix := Prepare(nodes, nil)
	for _, nodesAsked := range []int{0, 2} {
		b.Run(fmt.Sprintf("resources.nodes=%d", nodesAsked), func(b *testing.B) {
			sp := testSpec()
			sp.Resources.Nodes = nodesAsked
			q := Query{Spec: sp, Scope: []string{"*"}, MinScore: 85, Now: now, OfflineAfter: time.Minute}
			lq := q
			lq.Spec = ListedSpec(sp)
			listed := ix.Match(lq)
			defer listed.Release()
			b.ReportAllocs()
			b.ResetTimer()
			found := 0
			for i := 0; i < b.N; i++ {
				found = len(ix.Gangs(q, &listed).Found)
			}
			b.ReportMetric(float64(found), "gangs")
		})
	}
}
