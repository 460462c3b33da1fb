package match

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// TestPlaceGang (issue #34): a gang is placed on nodes that advertise a
// rendezvous, all free; with some of its nodes busy the run waits for
// them; a region without one says why, and a region whose nodes would
// make one but advertise no rendezvous names the agent flags.
func TestPlaceGang(t *testing.T) {
	t.Parallel()
	a100 := func(id, region string, rdv bool) store.Node {
		n := node(id, region, "a100-80gb", 4, 30, 5)
		if rdv {
			n.Labels.JobAddress, n.Labels.JobPortMin, n.Labels.JobPortMax = "10.0.0.1", 29500, 29599
		}
		return n
	}
	pod := func(id, provider string) store.Node {
		n := node(id, "k8s", "a100-80gb", 4, 30, 5)
		n.Labels.Provider, n.Index.Provider = provider, provider
		n.Labels.JobAddress, n.Labels.JobPortMin, n.Labels.JobPortMax = rendezvous.PodAddress, 29500, 29599
		return n
	}
	ix := Prepare([]store.Node{
		a100("usw-1", "us-west-2", true), a100("usw-2", "us-west-2", true), a100("usw-3", "us-west-2", true),
		a100("euc-1", "eu-central-1", false), a100("euc-2", "eu-central-1", false), a100("euc-3", "eu-central-1", true),
		a100("aps-1", "ap-south-1", true),
		// Kubernetes nodes: their jobs are reached at pod IPs, which
		// reach each other within one cluster only.
		pod("ka-1", "kubernetes:a"), pod("kb-1", "kubernetes:b"), pod("ka-2", "kubernetes:a"), pod("kb-2", "kubernetes:b"), pod("kc-1", "kubernetes:c"),
	}, nil)
	type out struct {
		Nodes []string
		Busy  []string
		Miss  string
	}
	for _, tc := range []struct {
		name       string
		region     string
		nodes      int
		busy, skip []string
		want       out
	}{
		{"two of three free", "us-west-2", 2, []string{"usw-1"}, nil, out{Nodes: []string{"usw-2", "usw-3"}}},
		{"a node lost on before is left out", "us-west-2", 2, nil, []string{"usw-2"}, out{Nodes: []string{"usw-1", "usw-3"}}},
		{"too few free: wait for the busy ones", "us-west-2", 3, []string{"usw-2"}, nil, out{Busy: []string{"usw-2"}}},
		{"too few at all", "us-west-2", 4, nil, nil, out{Miss: "only 3 certified a100-80gb nodes, a gang needs 4"}},
		{"too few that advertise a rendezvous", "eu-central-1", 2, nil, nil, out{Miss: "3 candidate nodes for 4 GPUs each, but only 1 advertise a job address and ports for the gang's rendezvous (a gang needs 2; start the local executor's agents with --job-address and --job-ports, a Slurm or Kubernetes agent with --job-ports)"}},
		{"one node", "ap-south-1", 2, nil, nil, out{Miss: "only 1 certified a100-80gb node, a gang needs 2"}},
		{"kubernetes nodes of one cluster", "k8s", 2, nil, nil, out{Nodes: []string{"ka-1", "ka-2"}}},
		{"kubernetes nodes of one cluster, the other busy", "k8s", 2, []string{"ka-2"}, nil, out{Nodes: []string{"kb-1", "kb-2"}}},
		{"never across clusters", "k8s", 3, nil, nil, out{Miss: "5 candidate nodes for 4 GPUs each advertise a rendezvous, but at most 2 can join one gang (a gang needs 3; a Slurm cluster's nodes run a gang as one batch job there, and a Kubernetes cluster's pods reach each other only within it)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := func(ids []string) func(string) bool {
				return func(id string) bool {
					for _, x := range ids {
						if x == id {
							return true
						}
					}
					return false
				}
			}
			q := Query{Spec: gangSpec(4*tc.nodes, tc.nodes), Scope: []string{"*"}, Regions: []string{tc.region}, MinScore: 85, Now: now, OfflineAfter: 30 * time.Second}
			busy := in(tc.busy)
			pick := ix.PlaceGang(q, tc.nodes, in(tc.skip), func(id string) bool { return !busy(id) })
			var got out
			for _, r := range pick.Nodes {
				got.Nodes = append(got.Nodes, r.Node.ID)
			}
			got.Busy, got.Miss = pick.Busy, pick.Miss
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("PlaceGang (-want +got):\n%s", d)
			}
		})
	}
}

// TestPlaceGangSlurmSite (issue #34): the nodes of a Slurm cluster run a
// gang as one batch job of their agent, so a gang is two nodes of one
// cluster, never a node of each of two clusters nor a Slurm node with a
// local agent, though all advertise a rendezvous.
func TestPlaceGangSlurmSite(t *testing.T) {
	t.Parallel()
	at := func(id, provider string) store.Node {
		n := node(id, "hpc", "a100-80gb", 4, 30, 5)
		n.Labels.Provider, n.Index.Provider = provider, provider
		n.Labels.JobAddress, n.Labels.JobPortMin, n.Labels.JobPortMax = "10.0.0.1", 29500, 29599
		return n
	}
	const mixMiss = "2 candidate nodes for 4 GPUs each advertise a rendezvous, but at most 1 can join one gang (a gang needs 2; a Slurm cluster's nodes run a gang as one batch job there, and a Kubernetes cluster's pods reach each other only within it)"
	for _, tc := range []struct {
		name  string
		nodes []store.Node
		want  []string
		miss  string
	}{
		{"two nodes of one cluster", []store.Node{at("a-n1", "slurm:a"), at("b-n1", "slurm:b"), at("a-n2", "slurm:a")}, []string{"a-n1", "a-n2"}, ""},
		{"one node of each of two clusters", []store.Node{at("a-n1", "slurm:a"), at("b-n1", "slurm:b")}, nil, mixMiss},
		{"a cluster node and a local agent", []store.Node{at("a-n1", "slurm:a"), at("local-1", "aws")}, nil, mixMiss},
		{"two local agents", []store.Node{at("local-1", "aws"), at("local-2", "gcp")}, []string{"local-1", "local-2"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ix := Prepare(tc.nodes, nil)
			q := Query{Spec: gangSpec(8, 2), Scope: []string{"*"}, Regions: []string{"hpc"}, MinScore: 85, Now: now, OfflineAfter: 30 * time.Second}
			pick := ix.PlaceGang(q, 2, func(string) bool { return false }, func(string) bool { return true })
			var got []string
			for _, r := range pick.Nodes {
				got = append(got, r.Node.ID)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("PlaceGang's nodes (-want +got):\n%s", d)
			}
			if pick.Miss != tc.miss {
				t.Errorf("PlaceGang's reason:\n got %q\nwant %q", pick.Miss, tc.miss)
			}
		})
	}
}
