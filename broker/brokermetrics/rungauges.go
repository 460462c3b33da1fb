package brokermetrics

import (
	"encoding/json"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupass/gpupass/internal/events"
)

// Runs' own training metrics as gauges labelled by allocation: opt in
// (gpupass-broker --run-metrics-gauges), because each run is a series and
// a fleet runs many. At most max runs are kept; the run that reported
// least recently is dropped to make room, and the drop is counted.

// DefaultRunGaugeSeries is the default cap on runs exported as gauges.
const DefaultRunGaugeSeries = 1000

type runGauges struct {
	max     int
	mu      sync.Mutex
	runs    map[string]*runPoint
	tick    uint64 // orders runs by last report, for dropping
	dropped prometheus.Counter
}

type runPoint struct {
	region     string
	loss       float64
	hasLoss    bool
	step       int64
	stepRate   float64
	hasRate    bool
	lastT      float64 // seconds, of the point step came from
	lastReport uint64
}

var (
	runLossDesc = prometheus.NewDesc(Namespace+"_run_loss", "The last loss a run reported (opt-in: --run-metrics-gauges).",
		[]string{"alloc", "region"}, nil)
	runStepDesc = prometheus.NewDesc(Namespace+"_run_step", "The last training step a run reported (opt-in: --run-metrics-gauges).",
		[]string{"alloc", "region"}, nil)
	runRateDesc = prometheus.NewDesc(Namespace+"_run_steps_per_second", "A run's step rate between its last two metric points (opt-in: --run-metrics-gauges).",
		[]string{"alloc", "region"}, nil)
)

// EnableRunGauges turns on per-run gauges for at most maxSeries runs
// (DefaultRunGaugeSeries when zero or less).
func (m *Metrics) EnableRunGauges(maxSeries int) {
	if maxSeries <= 0 {
		maxSeries = DefaultRunGaugeSeries
	}
	g := &runGauges{max: maxSeries, runs: map[string]*runPoint{}, dropped: newDroppedCounter()}
	m.reg.MustRegister(g, g.dropped)
	m.runGauges = g
	m.own = append(m.own, g, g.dropped)
}

func newDroppedCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "run_series_dropped_total",
		Help: "Runs whose training-metric gauges were dropped to stay under the cap (--run-metrics-gauges-max)."})
}

// RunMetric takes one metric record (JSON of events.Metric) of a run;
// it does nothing unless EnableRunGauges was called. Unreadable records
// are ignored: the store keeps them, the gauges are a view.
func (m *Metrics) RunMetric(alloc, region string, data []byte) {
	if m == nil || m.runGauges == nil {
		return
	}
	var p events.Metric
	if json.Unmarshal(data, &p) != nil {
		return
	}
	m.runGauges.take(alloc, region, p)
}

func (g *runGauges) take(alloc, region string, p events.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.runs[alloc]
	if !ok {
		if len(g.runs) >= g.max {
			g.dropOldest()
		}
		r = &runPoint{region: region, step: -1}
		g.runs[alloc] = r
	}
	g.tick++
	r.lastReport = g.tick
	if l, ok := p.Loss(); ok {
		r.loss, r.hasLoss = l, true
	}
	t := float64(p.Time.UnixNano()) / 1e9
	if r.step >= 0 && p.Step > r.step && t > r.lastT && !p.Time.IsZero() {
		r.stepRate, r.hasRate = float64(p.Step-r.step)/(t-r.lastT), true
	}
	if p.Step >= r.step {
		r.step, r.lastT = p.Step, t
	}
}

// dropOldest removes the run that reported least recently. A linear scan:
// it runs only when the cap is reached, and the cap is small.
func (g *runGauges) dropOldest() {
	var oldest string
	var at uint64
	for id, r := range g.runs {
		if oldest == "" || r.lastReport < at {
			oldest, at = id, r.lastReport
		}
	}
	delete(g.runs, oldest)
	g.dropped.Inc()
}

func (g *runGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- runLossDesc
	ch <- runStepDesc
	ch <- runRateDesc
}

func (g *runGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, r := range g.runs {
		if r.hasLoss {
			ch <- prometheus.MustNewConstMetric(runLossDesc, prometheus.GaugeValue, r.loss, id, r.region)
		}
		if r.step >= 0 {
			ch <- prometheus.MustNewConstMetric(runStepDesc, prometheus.GaugeValue, float64(r.step), id, r.region)
		}
		if r.hasRate {
			ch <- prometheus.MustNewConstMetric(runRateDesc, prometheus.GaugeValue, r.stepRate, id, r.region)
		}
	}
}
