// Package agentmetrics is gpupass-agent's Prometheus instrumentation,
// served at GET /metrics on the agent's local query endpoint (loopback by
// default, like the rest of it): the run in progress and its spool, the
// upload lag, the last conformance suite run per check, and GPU telemetry
// from NVML. NVML missing (no driver, no cgo) is a metric
// (gpupass_agent_nvml_up 0 with the reason), never a failure.
//
// It imports no broker code and no agent package (the agent imports it);
// labels are states, check names, GPU indexes and UUIDs: bounded sets.
package agentmetrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/promutil"
)

// Namespace prefixes every family: gpupass_agent_….
const Namespace = "gpupass_agent"

// RunStates are the values of gpupass_agent_run_state's state label.
var RunStates = []string{"idle", "starting", "running"}

// Metrics holds the agent's families on a registry of its own.
type Metrics struct {
	reg *prometheus.Registry

	mu  sync.Mutex
	run *trackedRun // nil when idle

	checkDur   *prometheus.GaugeVec
	checkPass  *prometheus.GaugeVec
	suiteWall  prometheus.Gauge
	suiteRuns  *prometheus.CounterVec
	uploadRecs prometheus.Counter
	uploadErrs prometheus.Counter
	own        []prometheus.Collector
}

type trackedRun struct {
	sp    *spool.Spool
	state func() string
	// lastAck is when the broker last acknowledged records of this run
	// (the run's start until it first does).
	lastAck time.Time
}

// New registers the agent's families, the Go runtime's and the process's;
// gpu is the NVML collector (NewNVML; nil leaves GPU telemetry out).
func New(gpu prometheus.Collector) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.checkDur = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "conformance_check_duration_seconds",
		Help: "Time each conformance check took in the last suite run (0 when its result was reused)."}, []string{"check"})
	m.checkPass = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "conformance_check_passed",
		Help: "Whether each check passed in the last suite run: 1 pass, 0 fail (skipped checks count as passed)."}, []string{"check"})
	m.suiteWall = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "conformance_suite_duration_seconds",
		Help: "Wall time of the last conformance suite run (probes run in parallel)."})
	m.suiteRuns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "conformance_suite_runs_total",
		Help: "Conformance suite runs, by result (passed or failed)."}, []string{"result"})
	m.uploadRecs = prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "uploaded_records_total",
		Help: "Run records the broker acknowledged holding."})
	m.uploadErrs = prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "upload_errors_total",
		Help: "Record uploads that failed (each is retried)."})
	m.own = []prometheus.Collector{m.checkDur, m.checkPass, m.suiteWall, m.suiteRuns, m.uploadRecs, m.uploadErrs, runCollector{m}}
	if gpu != nil {
		m.own = append(m.own, gpu)
	}
	m.reg.MustRegister(m.own...)
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Names lists the names of the gpupass families, GPU ones included
// whether or not NVML is there: what dashboards may query.
func (m *Metrics) Names() []string {
	return promutil.Names(append(m.own[:len(m.own):len(m.own)], gpuFamilies{})...)
}

// gpuFamilies describes the GPU families whatever the build.
type gpuFamilies struct{}

func (gpuFamilies) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range gpuDescs {
		ch <- d
	}
}

func (gpuFamilies) Collect(chan<- prometheus.Metric) {}

// Registry is where the families live.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, MaxRequestsInFlight: 2, Timeout: 10 * time.Second})
}

// Conformance takes the checks and wall time of a suite run. Every method
// is safe on a nil *Metrics.
func (m *Metrics) Conformance(checks []conformance.Check, wall time.Duration) {
	if m == nil {
		return
	}
	passed := true
	for _, c := range checks {
		m.checkDur.WithLabelValues(c.Name).Set(c.DurationMS / 1000)
		v := 1.0
		if c.Status == conformance.Fail {
			v, passed = 0, false
		}
		m.checkPass.WithLabelValues(c.Name).Set(v)
	}
	m.suiteWall.Set(wall.Seconds())
	result := "passed"
	if !passed {
		result = "failed"
	}
	m.suiteRuns.WithLabelValues(result).Inc()
}

// Track makes sp and state the run in progress (one at a time: the agent
// runs one) and returns sink wrapped to time acknowledgements; call the
// returned untrack when the run's command and checks are over.
func (m *Metrics) Track(sp *spool.Spool, state func() string, sink uploader.Sink) (uploader.Sink, func()) {
	if m == nil {
		return sink, func() {}
	}
	r := &trackedRun{sp: sp, state: state, lastAck: time.Now()}
	m.mu.Lock()
	m.run = r
	m.mu.Unlock()
	return &ackSink{m: m, r: r, next: sink}, func() {
		m.mu.Lock()
		if m.run == r {
			m.run = nil
		}
		m.mu.Unlock()
	}
}

type ackSink struct {
	m    *Metrics
	r    *trackedRun
	next uploader.Sink
}

func (s *ackSink) Upload(ctx context.Context, allocID string, recs []spool.Record) (uint64, error) {
	held, err := s.next.Upload(ctx, allocID, recs)
	if err != nil {
		s.m.uploadErrs.Inc()
		return held, err
	}
	var n int
	for _, r := range recs {
		if r.Seq <= held {
			n++
		}
	}
	s.m.uploadRecs.Add(float64(n))
	s.m.mu.Lock()
	s.r.lastAck = time.Now()
	s.m.mu.Unlock()
	return held, nil
}

var (
	runStateDesc = prometheus.NewDesc(Namespace+"_run_state", "The run in progress on this node by state (idle: none); 1 for the current state, 0 for the others.",
		[]string{"state"}, nil)
	spoolRecsDesc  = prometheus.NewDesc(Namespace+"_spool_unacked_records", "Records of the run in progress spooled on disk and not yet acknowledged by the broker.", nil, nil)
	spoolBytesDesc = prometheus.NewDesc(Namespace+"_spool_bytes", "Bytes of the run in progress's spool on disk (records not yet acknowledged and those sharing a segment with them).", nil, nil)
	uploadLagDesc  = prometheus.NewDesc(Namespace+"_upload_lag_seconds", "While records wait in the spool: time since the broker last acknowledged any (0 when none wait).", nil, nil)
)

type runCollector struct{ m *Metrics }

func (c runCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runStateDesc
	ch <- spoolRecsDesc
	ch <- spoolBytesDesc
	ch <- uploadLagDesc
}

func (c runCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	r := c.m.run
	var lastAck time.Time
	if r != nil {
		lastAck = r.lastAck
	}
	c.m.mu.Unlock()
	state := "idle"
	var st spool.Stats
	if r != nil {
		state = r.state()
		st = r.sp.Stats()
	}
	for _, s := range RunStates {
		v := 0.0
		if s == state {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(runStateDesc, prometheus.GaugeValue, v, s)
	}
	lag := 0.0
	if st.Pending > 0 {
		lag = time.Since(lastAck).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(spoolRecsDesc, prometheus.GaugeValue, float64(st.Pending))
	ch <- prometheus.MustNewConstMetric(spoolBytesDesc, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(uploadLagDesc, prometheus.GaugeValue, lag)
}
