package spec

import (
	"errors"

	"github.com/gpupass/gpupass/internal/metrics"
)

// metricPattern checks metrics.pattern with the rule the readers use
// (metrics.CompilePattern), so a pattern validate passes is one the agent
// and compare can use.
func (c *checker) metricPattern() {
	const path = "metrics.pattern"
	if !c.d.Has(path) {
		return
	}
	_, err := metrics.CompilePattern(c.d.Spec.Metrics.Pattern)
	var pe *metrics.PatternError
	if errors.As(err, &pe) {
		c.add(path, SevError, path, "metric pattern: "+pe.Problem, pe.Fix+" (or leave metrics.pattern out to read `loss 1.23`, `loss=1.23`, `loss: 1.23`)")
	}
}
