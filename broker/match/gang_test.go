package match

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/spec"
)

func gangSpec(count, nodes int) *spec.Spec {
	sp := testSpec()
	sp.Resources.Accelerator, sp.Resources.Count, sp.Resources.Nodes = "a100-80gb", count, nodes
	return sp
}

type gangOut struct {
	Found  map[string][]string // region: node ids
	Per    map[string]int      // region: GPUs per node
	Missed map[string]string   // region: reason
}

func gangsOf(ix *Index, g Gangs) gangOut {
	out := gangOut{Found: map[string][]string{}, Per: map[string]int{}, Missed: map[string]string{}}
	for _, f := range g.Found {
		for _, n := range f.Nodes {
			out.Found[f.Region] = append(out.Found[f.Region], ix.ID(n))
		}
		out.Per[f.Region] = f.GPUsPerNode
		if f.Accelerator != "a100-80gb" {
			out.Missed[f.Region] = "gang of " + f.Accelerator
		}
	}
	for _, m := range g.Missed {
		out.Missed[m.Region] = m.Reason
	}
	return out
}

// TestGangs: for each region, the fewest nodes (or exactly
// resources.nodes) of one accelerator and one runtime whose GPUs add up
// to resources.count evenly, each with the declared bandwidth; a region
// without one says which requirement leaves too few nodes.
func TestGangs(t *testing.T) {
	t.Parallel()
	a100 := func(id, region string, gpus int, change func(*store.Node)) store.Node {
		n := node(id, region, "a100-80gb", gpus, 30, 5)
		if change != nil {
			change(&n)
		}
		return n
	}
	slow := func(n *store.Node) { n.Index.BandwidthGbps = 100 }
	fleet := []store.Node{
		a100("usw-1", "us-west-2", 4, nil), a100("usw-2", "us-west-2", 4, nil),
		a100("euc-1", "eu-central-1", 4, nil), a100("euc-2", "eu-central-1", 4, slow), a100("euc-3", "eu-central-1", 4, slow),
		a100("aps-1", "ap-south-1", 4, nil), a100("aps-2", "ap-south-1", 4, func(n *store.Node) { n.Index.Runtime.CUDA = "12.2.140" }),
		a100("use-big", "us-east-1", 8, nil), a100("use-1", "us-east-1", 4, nil), a100("use-2", "us-east-1", 4, nil),
		a100("cac-1", "ca-central-1", 2, nil), a100("cac-2", "ca-central-1", 2, nil), a100("cac-3", "ca-central-1", 2, nil), a100("cac-4", "ca-central-1", 2, nil),
		a100("fra-1", "eu-west-3", 4, nil), a100("fra-2", "eu-west-3", 4, func(n *store.Node) { n.Index.Runtime.FIPSEnabled = true }),
		a100("syd-1", "ap-southeast-2", 4, nil), a100("syd-2", "ap-southeast-2", 4, func(n *store.Node) { n.LastSeen = now.Add(-time.Hour) }),
		node("h-1", "sa-east-1", "h100-sxm5", 8, 30, 5), node("h-2", "sa-east-1", "h100-sxm5", 8, 30, 5),
	}
	ix := Prepare(fleet, nil)
	q := func(sp *spec.Spec, change func(*Query)) Query {
		q := Query{Spec: sp, Scope: []string{"*"}, MinScore: 85, Now: now, OfflineAfter: 30 * time.Second}
		if change != nil {
			change(&q)
		}
		return q
	}
	for _, tc := range []struct {
		name  string
		query Query
		want  gangOut
	}{
		{"nodes: 2", q(gangSpec(8, 2), nil), gangOut{
			Found: map[string][]string{"us-west-2": {"usw-1", "usw-2"}, "us-east-1": {"use-1", "use-2"}, "eu-west-3": nil},
			Per:   map[string]int{"us-west-2": 4, "us-east-1": 4},
			Missed: map[string]string{
				"eu-central-1":   "3 certified a100-80gb nodes, but only 1 has ≥ 200 Gbit/s (a gang needs 2)",
				"ap-south-1":     "2 certified a100-80gb nodes, but only 1 matches the spec's runtime (a gang needs 2)",
				"ca-central-1":   "4 certified a100-80gb nodes, but none has ≥ 4 GPUs (a gang needs 2)",
				"eu-west-3":      "2 certified a100-80gb nodes qualify, but no 2 of them share one runtime (driver, CUDA, Python, PyTorch)",
				"ap-southeast-2": "only 1 certified a100-80gb node online (1 offline), a gang needs 2",
				"sa-east-1":      "no certified a100-80gb node, a gang needs 2",
			}}},
		{"nodes left out: the fewest, no gang where one node holds the count, and no miss", q(gangSpec(8, 0), nil), gangOut{
			Found:  map[string][]string{"us-west-2": {"usw-1", "usw-2"}, "ca-central-1": {"cac-1", "cac-2", "cac-3", "cac-4"}},
			Per:    map[string]int{"us-west-2": 4, "ca-central-1": 2},
			Missed: map[string]string{}}},
		{"nodes: 4 takes 2 GPUs of each", q(gangSpec(8, 4), func(q *Query) { q.Regions = []string{"ca-*", "us-west-2"} }), gangOut{
			Found:  map[string][]string{"ca-central-1": {"cac-1", "cac-2", "cac-3", "cac-4"}},
			Per:    map[string]int{"ca-central-1": 2},
			Missed: map[string]string{"us-west-2": "only 2 certified a100-80gb nodes, a gang needs 4"}}},
		{"a price limit", q(gangSpec(8, 2), func(q *Query) { q.Regions, q.MaxPrice = []string{"us-west-2"}, 10 }), gangOut{
			Found: map[string][]string{}, Per: map[string]int{},
			Missed: map[string]string{"us-west-2": "2 certified a100-80gb nodes, but none costs ≤ 10/h (a gang needs 2)"}}},
		{"out of scope regions are not named", q(gangSpec(8, 2), func(q *Query) { q.Scope = []string{"us-west-*"} }), gangOut{
			Found: map[string][]string{"us-west-2": {"usw-1", "usw-2"}}, Per: map[string]int{"us-west-2": 4}, Missed: map[string]string{}}},
		{"nodes: 1 is no gang", q(gangSpec(8, 1), nil), gangOut{Found: map[string][]string{}, Per: map[string]int{}, Missed: map[string]string{}}},
		{"count 1 is no gang", q(gangSpec(1, 0), nil), gangOut{Found: map[string][]string{}, Per: map[string]int{}, Missed: map[string]string{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := gangsOf(ix, ix.Gangs(tc.query, nil))
			lq := tc.query
			lq.Spec = ListedSpec(tc.query.Spec)
			listed := ix.Match(lq)
			if d := cmp.Diff(got, gangsOf(ix, ix.Gangs(tc.query, &listed))); d != "" {
				t.Errorf("Gangs with the listed match differs from Gangs alone (-alone +listed):\n%s", d)
			}
			listed.Release()
			for r, ids := range tc.want.Found {
				if ids == nil {
					delete(tc.want.Found, r)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("Gangs (-want +got):\n%s", d)
			}
		})
	}
}

func TestNodeCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		count, nodes int
		want         []int
	}{
		{8, 0, []int{2, 4, 8}}, {8, 2, []int{2}}, {8, 1, nil}, {1, 0, nil}, {6, 0, []int{2, 3, 6}}, {8, 3, nil},
	} {
		if got := NodeCounts(gangSpec(tc.count, tc.nodes)); !cmp.Equal(got, tc.want) {
			t.Errorf("NodeCounts(count %d, nodes %d) = %v, want %v", tc.count, tc.nodes, got, tc.want)
		}
	}
}

// TestGangSizes: only the sizes whose share some node holds are matched,
// at most MaxGangSizes of them, so a count with hundreds of divisors
// costs no more than a few matches.
func TestGangSizes(t *testing.T) {
	t.Parallel()
	ix := Prepare([]store.Node{node("a", "r", "a100-80gb", 8, 30, 5), node("b", "r", "a100-80gb", 2, 30, 5)}, nil)
	for _, tc := range []struct {
		count, nodes int
		want         []int
	}{
		{8, 0, []int{2, 4, 8}},
		{16, 0, []int{2, 4, 8, 16}},
		{720720, 0, nil}, // 240 divisors, but every share is above 8 GPUs
		{1008, 0, []int{126, 144, 168, 252, 336, 504, 1008}},
		{64, 2, nil},
		{16, 2, []int{2}},
	} {
		if got := ix.gangSizes(gangSpec(tc.count, tc.nodes)); !cmp.Equal(got, tc.want) {
			t.Errorf("gangSizes(count %d, nodes %d) = %v, want %v", tc.count, tc.nodes, got, tc.want)
		}
	}
	many := Prepare([]store.Node{node("a", "r", "a100-80gb", 720720, 30, 5)}, nil)
	if got := many.gangSizes(gangSpec(720720, 0)); len(got) != MaxGangSizes || got[0] != 2 {
		t.Errorf("a node of every share: %d sizes from %v, want the first %d", len(got), got, MaxGangSizes)
	}
}
