package slurmtest

import (
	"os"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Run(m)) }

// TestClusterRunsABatchJobOnEachNode proves the cluster is real: each node
// runs a job pinned to it with its own GPU GRES.
func TestClusterRunsABatchJobOnEachNode(t *testing.T) {
	c := Shared(t)
	out := c.Command(t, "sinfo", "-h", "-N", "-o", "%N %G")
	for _, n := range Nodes {
		if !strings.Contains(out, n.Name+" gpu:"+n.GPUType) {
			t.Errorf("sinfo does not show %s with gpu:%s:\n%s", n.Name, n.GPUType, out)
		}
		got := c.Command(t, "srun", "-w", n.Name, "-N1", "--gres=gpu:"+n.GPUType+":1", "sh", "-c", "echo $SLURMD_NODENAME")
		if strings.TrimSpace(got) != n.Name {
			t.Errorf("srun -w %s ran on %q", n.Name, got)
		}
	}
}
