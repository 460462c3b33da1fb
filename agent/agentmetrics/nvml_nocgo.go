//go:build !cgo

package agentmetrics

import "github.com/prometheus/client_golang/prometheus"

// DefaultNVML returns a collector that says NVML is not available: this
// build has no cgo, so libnvidia-ml cannot be loaded.
func DefaultNVML() prometheus.Collector { return noNVML{} }

type noNVML struct{}

func (noNVML) Describe(ch chan<- *prometheus.Desc) { ch <- nvmlUpDesc }

func (noNVML) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(nvmlUpDesc, prometheus.GaugeValue, 0, "NVML not available: built without cgo")
}
