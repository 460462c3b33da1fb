package slurm

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/probe"
)

// TestGresCheck: the measured GPU count of a Slurm node is checked
// against its GRES; a disagreement fails the report, naming both.
func TestGresCheck(t *testing.T) {
	t.Parallel()
	gpus := func(n int) *probe.Facts {
		f := &probe.Facts{}
		f.GPU.Available = true
		f.GPU.GPUs = make([]probe.GPU, n)
		return f
	}
	for _, tt := range []struct {
		name     string
		node     Node
		facts    *probe.Facts
		status   conformance.Status
		expected string
		message  string
	}{
		{"agrees", Node{Name: "n1", GPUType: "a100", GPUs: 4}, gpus(4), conformance.Pass, "4", "4 GPU(s), as its GRES gpu:a100:4"},
		{"more measured than GRES", Node{Name: "n2", GPUType: "h100", GPUs: 2}, gpus(8), conformance.Fail, "2",
			"measured 8 GPU(s) on n2, but its slurm GRES (gpu:h100:2) gives jobs 2"},
		{"GPUs but no GRES", Node{Name: "n3"}, gpus(1), conformance.Fail, "0", "(no gpu GRES) gives jobs 0"},
		{"not measured", Node{Name: "n4", GPUs: 2}, &probe.Facts{}, conformance.Skip, "2", "could not be measured"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := &slurmNode{name: tt.node.Name, log: slog.New(slog.DiscardHandler)}
			n.node.Set(tt.node)
			c := n.gresCheck(tt.facts)
			if c.Name != conformance.CheckSlurmGres || c.Status != tt.status || c.Expected != tt.expected || !strings.Contains(c.Message, tt.message) {
				t.Errorf("check = %+v, want %s, expected %s, message with %q", c, tt.status, tt.expected, tt.message)
			}
		})
	}
}
