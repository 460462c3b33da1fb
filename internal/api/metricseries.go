package api

import (
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/metrics"
)

// MetricSeries is one metric of a run as GetMetrics returns it, as a
// series compare can read: labelled by region, sourced "broker:ALLOC",
// with the run's start, restarts, price and simulated flag. Points
// without the metric are skipped; metric "" is loss. The series is not
// normalised (the caller does that once it has decided to use it).
func MetricSeries(m *gpupassv1.GetMetricsResponse, metric string) *metrics.Series {
	if metric == "" {
		metric = "loss"
	}
	run := m.GetRun()
	s := &metrics.Series{Label: run.GetRegion(), Source: "broker:" + run.GetId(), Metric: metric, Format: "gpupass-broker",
		Start: run.GetStartedUnixNano(), Restarts: int(run.GetRestarts()), PricePerHour: run.GetPricePerHour(), Simulated: run.GetSimulated()}
	for _, p := range m.Points {
		if v, ok := p.Values[metric]; ok {
			s.Points = append(s.Points, metrics.Point{Step: p.Step, Value: v, Time: p.TimeUnixNano})
		}
	}
	return s
}
