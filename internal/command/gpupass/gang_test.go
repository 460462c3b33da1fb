package gpupass_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
)

// writeGangSpec is the H100 test spec with resources as given in place
// of its `count: 8` line.
func writeGangSpec(t *testing.T, resources string) string {
	t.Helper()
	b, err := os.ReadFile("../../../broker/testdata/h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "  count: 8\n") {
		t.Fatal("h100.yaml has no `count: 8` line to replace")
	}
	s := strings.Replace(string(b), "  count: 8\n", resources, 1)
	p := filepath.Join(t.TempDir(), "gpupass.yaml")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue #34: a spec whose 8 GPUs take two 4-GPU nodes. Dry-run shows
// each region's gang ("2 × ID, ID in us-west-2") or why it has none
// ("3 certified h100-sxm5 nodes, but only 1 has ≥ 200 Gbit/s"); train
// of it on nodes whose agents advertise no rendezvous fails the run at
// once, naming the agent flags that would let them take ranks; without
// resources.nodes the gangs are shown too, and a region whose one node
// holds the count needs none.
func TestDryRunGangsAndSubmit(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	four := func(region string, gbps float64) brokertest.NodeSpec {
		n := brokertest.H100(region, 20)
		n.Count, n.BandwidthGbps = 4, gbps
		return n
	}
	reg := func(n brokertest.NodeSpec) string { return brokertest.Register(t, b.URL, agentTok, n).ID }
	west := []string{reg(four("us-west-2", 400)), reg(four("us-west-2", 400))}
	reg(four("eu-central-1", 400))
	reg(four("eu-central-1", 100))
	reg(four("eu-central-1", 100))
	reg(brokertest.H100("ap-south-1", 20)) // one node of 8 GPUs
	broker := []string{"--broker-url", b.URL, "--broker-token", b.Token(t, store.RoleSubmit, "*")}
	dry := func(spec string, args ...string) string {
		t.Helper()
		code, out, errOut := runMain(t, append(append([]string{"validate", "--spec", spec, "--dry-run", "--min-health-score", "0"}, broker...), args...)...)
		if code != 0 {
			t.Fatalf("validate --dry-run: exit %d\n%s%s", code, out, errOut)
		}
		return out
	}
	// Best first: by score, which the RTT of each node moves.
	pair := func(out string) bool {
		return strings.Contains(out, "2 × "+west[0]+", "+west[1]+" in us-west-2 (4 × h100-sxm5 each)") ||
			strings.Contains(out, "2 × "+west[1]+", "+west[0]+" in us-west-2 (4 × h100-sxm5 each)")
	}

	twoNodes := writeGangSpec(t, "  count: 8\n  nodes: 2\n")
	out := dry(twoNodes)
	if !pair(out) {
		t.Errorf("dry-run of count 8, nodes 2 lacks the gang of %v in us-west-2:\n%s", west, out)
	}
	for _, want := range []string{
		"gangs (one run across several nodes; placed on local agents started with --job-address and --job-ports, the nodes of one Slurm agent or Kubernetes agents started with --job-ports):",
		"no gang in eu-central-1: 3 certified h100-sxm5 nodes, but only 1 has ≥ 200 Gbit/s (a gang needs 2)",
		"no gang in ap-south-1: only 1 certified h100-sxm5 node, a gang needs 2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry-run of count 8, nodes 2 lacks %q:\n%s", want, out)
		}
	}
	// Each node is matched for its share: the 4-GPU nodes are candidates.
	if !strings.Contains(out, "4 candidate(s)") {
		t.Errorf("dry-run of count 8, nodes 2: want the four 4-GPU nodes of 400 Gbit/s and the 8-GPU one as candidates of their share:\n%s", out)
	}

	code, jsonOut, errOut := runMain(t, append([]string{"validate", "--spec", twoNodes, "--dry-run", "--min-health-score", "0", "-o", "json"}, broker...)...)
	var doc struct {
		DryRun struct {
			Gangs []struct {
				Region      string   `json:"region"`
				GPUsPerNode int      `json:"gpus_per_node"`
				NodeIDs     []string `json:"node_ids"`
			} `json:"gangs"`
			GangMisses []struct{ Region, Reason string } `json:"gang_misses"`
		} `json:"dry_run"`
	}
	if err := json.Unmarshal([]byte(jsonOut), &doc); code != 0 || err != nil {
		t.Fatalf("validate --dry-run -o json: exit %d, %v\n%s%s", code, err, jsonOut, errOut)
	}
	if g := doc.DryRun.Gangs; len(g) != 1 || g[0].Region != "us-west-2" || g[0].GPUsPerNode != 4 || len(g[0].NodeIDs) != 2 || len(doc.DryRun.GangMisses) != 2 {
		t.Errorf("-o json gangs %+v, misses %+v", g, doc.DryRun.GangMisses)
	}

	// These nodes' agents advertise no rendezvous (no --job-address,
	// --job-ports): the run is taken, and fails at once saying so,
	// with no rank on any node.
	code, out, errOut = runMain(t, append(append([]string{"train", "--spec", twoNodes, "--no-workdir", "--min-health-score", "0", "--region", "us-west-2"}, broker...), "--", "true")...)
	t.Logf("train: exit %d\n%s%s", code, out, errOut)
	code, listed, errOut := runMain(t, append([]string{"runs", "-o", "json"}, broker...)...)
	const why = "no gang of 2 nodes in us-west-2: 2 candidate nodes for 4 GPUs each, but none advertise a job address and ports for the gang's rendezvous"
	if code != 0 || !strings.Contains(listed, why) || strings.Count(listed, `"id"`) != 1 {
		t.Errorf("after train of a gang no node can hold: runs: exit %d, want one failed run saying %q:\n%s%s", code, why, listed, errOut)
	}
	// Without resources.nodes: the fewest nodes, and no gang where one
	// node holds all 8.
	out = dry(writeGangSpec(t, "  count: 8\n"))
	if !pair(out) || strings.Contains(out, "ap-south-1:") || strings.Contains(out, "in ap-south-1") {
		t.Errorf("dry-run of count 8 without nodes: want the us-west-2 gang and nothing for ap-south-1, whose one node holds it:\n%s", out)
	}
	// One node asked for: no gang, as before.
	out = dry(writeGangSpec(t, "  count: 4\n  nodes: 1\n"))
	if strings.Contains(out, "gang") {
		t.Errorf("dry-run of count 4, nodes 1 speaks of gangs:\n%s", out)
	}
}
