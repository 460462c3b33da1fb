package slurm

import (
	"fmt"
	"strconv"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/probe"
)

// gresCheck is conformance.CheckSlurmGres of the node's measurement f: a
// job gets the GRES count, not what the node has, so a node whose GRES
// disagrees with what was measured is flagged (the check fails: a spec's
// count is matched against the measurement). Skipped when the GPUs could
// not be measured (the gpu checks say why).
func (n *slurmNode) gresCheck(f *probe.Facts) conformance.Check {
	node := n.current()
	c := conformance.Check{Name: conformance.CheckSlurmGres, Expected: strconv.Itoa(node.GPUs)}
	if f == nil || !f.GPU.Available {
		c.Status, c.Actual, c.Message = conformance.Skip, "not measured", "the GPUs of "+n.name+" could not be measured"
		return c
	}
	measured := len(f.GPU.GPUs)
	c.Actual = strconv.Itoa(measured)
	gres := node.Gres()
	if gres == "" {
		gres = "no gpu GRES"
	}
	if measured != node.GPUs {
		c.Status = conformance.Fail
		c.Message = fmt.Sprintf("measured %d GPU(s) on %s, but its slurm GRES (%s) gives jobs %d: fix the node's Gres= in slurm.conf or its GPUs",
			measured, n.name, gres, node.GPUs)
		return c
	}
	c.Status, c.Message = conformance.Pass, fmt.Sprintf("%d GPU(s), as its GRES %s", measured, gres)
	return c
}
