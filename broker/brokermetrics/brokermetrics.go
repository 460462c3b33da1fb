// Package brokermetrics is the broker's Prometheus instrumentation: the
// metric families, a ConnectRPC interceptor that times every call by
// procedure and code, HTTP middleware for the other paths, and a
// collector that counts nodes and runs at scrape time through functions
// the broker passes in. It imports no broker code (the broker imports it)
// and puts no token, token id or secret in a label: labels are regions,
// states, procedures, codes, kinds and reasons, all bounded sets.
package brokermetrics

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpupass/gpupass/internal/promutil"
)

// Namespace prefixes every family: gpupass_broker_….
const Namespace = "gpupass_broker"

// NodeCount is how many nodes of a region are in a state (online or
// offline), certified (their last report passed) or not.
type NodeCount struct {
	Region    string
	State     string
	Certified bool
	Nodes     int
}

// Sources are read at scrape time. Each must be cheap at 10,000 nodes:
// the broker answers Nodes from its in-memory registry snapshot and Runs
// with one COUNT … GROUP BY.
type Sources struct {
	Nodes func(ctx context.Context) ([]NodeCount, error)
	// Runs counts runs by state; nil when the store keeps no runs.
	Runs func(ctx context.Context) (map[string]int64, error)
}

// scrapeTimeout bounds the store reads of one scrape; Prometheus's own
// default scrape timeout is 10 s.
const scrapeTimeout = 5 * time.Second

// Metrics holds the broker's families on a registry of its own (several
// brokers run in one test process, so never the global one).
type Metrics struct {
	reg *prometheus.Registry

	rpcDuration  *prometheus.HistogramVec
	httpDuration *prometheus.HistogramVec
	records      *prometheus.CounterVec
	recordBytes  *prometheus.CounterVec
	placement    prometheus.Histogram
	queueWait    prometheus.Histogram
	beatLag      prometheus.Histogram
	storeErrors  *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	// Replicas' wake-ups (broker/signal.go).
	signalsSent     prometheus.Counter
	signalsReceived prometheus.Counter
	signalErrors    *prometheus.CounterVec
	signalListening *prometheus.GaugeVec // no labels; no sample until set (one broker on SQLite)
	// Webhook delivery attempts (broker/webhooks.go).
	webhookDeliveries *prometheus.CounterVec

	runGauges *runGauges // nil unless opted in (EnableRunGauges)
	own       []prometheus.Collector
}

// New registers every family, the Go runtime's and the process's.
func New(src Sources) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.rpcDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "rpc_duration_seconds",
		Help:    "Time to serve a ConnectRPC/gRPC call, by procedure and Connect code (ok when it succeeded); streams count until they end.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"procedure", "code"})
	m.httpDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "http_request_duration_seconds",
		Help:    "Time to serve an HTTP request that is not an RPC (health, metrics, dashboard), by route pattern and status code.",
		Buckets: prometheus.DefBuckets,
	}, []string{"handler", "code"})
	m.records = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "records_ingested_total",
		Help: "Run records (log events, metric points, checkpoint chunks) stored from agents' uploads, by kind.",
	}, []string{"kind"})
	m.recordBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "ingested_bytes_total",
		Help: "Bytes of run record data stored from agents' uploads, by kind.",
	}, []string{"kind"})
	m.placement = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "placement_duration_seconds",
		Help:    "Time to match a pending run and lease it to a node (one successful placement).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
	m.queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "queue_wait_seconds",
		Help:    "Time from a run's submission to its lease on a node.",
		Buckets: []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600},
	})
	m.beatLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "heartbeat_lag_seconds",
		Help:    "Time from the broker's answer to an agent's heartbeat to that agent's next one: the heartbeat interval plus delay.",
		Buckets: []float64{.5, 1, 2, 5, 10, 11, 12, 15, 20, 30, 60},
	})
	m.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "store_errors_total",
		Help: "Store reads and writes that failed, by what the broker was doing (runs, heartbeats, metrics).",
	}, []string{"op"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "refusals_total",
		Help: "Requests and uploads refused, by reason: auth (no or unknown token), role (token may not call it), quota (a run over its record, log or rate limit), httpguard (request body over its limit or the memory budget), conns (a connection closed at accept: over --max-conns or --max-conns-per-ip).",
	}, []string{"reason"})
	m.signalsSent = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "signals_sent_total",
		Help: "Wake-ups sent to the other replicas on the store (PostgreSQL NOTIFY), at most one per 10 ms, each naming the runs and nodes woken.",
	})
	m.signalsReceived = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "signals_received_total",
		Help: "Wake-ups received from the other replicas (this replica's own are not counted).",
	})
	m.signalErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "signal_errors_total",
		Help: "Wake-ups that could not be sent (op=send), and listening connections lost or not made (op=listen); waiters then fall back to re-reading the store every second.",
	}, []string{"op"})
	m.signalListening = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "signal_listening",
		Help: "1 while this replica listens for the other replicas' wake-ups, 0 while it does not (its log followers and work polls then hear of other replicas' writes only at their once-a-second re-read). No sample on a broker that has no replicas.",
	}, nil)
	m.webhookDeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "webhook_attempts_total",
		Help: "Webhook delivery attempts, by result: delivered (a 2xx answer), retry (failed, another attempt is due), failed (failed, the attempts ran out).",
	}, []string{"result"})
	m.own = []prometheus.Collector{m.rpcDuration, m.httpDuration, m.records, m.recordBytes, m.placement, m.queueWait,
		m.beatLag, m.storeErrors, m.refusals, m.signalsSent, m.signalsReceived, m.signalErrors, m.signalListening, m.webhookDeliveries,
		&scrapeCollector{m: m, src: src}}
	m.reg.MustRegister(m.own...)
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Names lists the names of the gpupass families (run gauges included
// whether or not they are on): what dashboards may query.
func (m *Metrics) Names() []string {
	own := m.own
	if m.runGauges == nil {
		own = append(own[:len(own):len(own)], &runGauges{}, newDroppedCounter())
	}
	return promutil.Names(own...)
}

// WebhookDelivery counts one webhook delivery attempt by its result.
func (m *Metrics) WebhookDelivery(result string) { m.webhookDeliveries.WithLabelValues(result).Inc() }

// Registry is where the families live (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the exposition format (text, or OpenMetrics when asked).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, MaxRequestsInFlight: 4, Timeout: 2 * scrapeTimeout,
	})
}

// Every observer below is safe on a nil *Metrics, so broker code calls
// them without checking whether metrics are on.

// Ingested counts n stored records of kind totalling bytes.
func (m *Metrics) Ingested(kind string, n, bytes int) {
	if m == nil || n == 0 {
		return
	}
	m.records.WithLabelValues(kind).Add(float64(n))
	m.recordBytes.WithLabelValues(kind).Add(float64(bytes))
}

// Placed observes one placement: how long it took and how long the run
// had waited since submission.
func (m *Metrics) Placed(took, waited time.Duration) {
	if m == nil {
		return
	}
	m.placement.Observe(took.Seconds())
	m.queueWait.Observe(max(waited, 0).Seconds())
}

// HeartbeatLag observes the time between the broker's answer and the
// agent's next beat.
func (m *Metrics) HeartbeatLag(d time.Duration) {
	if m == nil {
		return
	}
	m.beatLag.Observe(max(d, 0).Seconds())
}

// StoreError counts a failed store operation.
func (m *Metrics) StoreError(op string) {
	if m == nil {
		return
	}
	m.storeErrors.WithLabelValues(op).Inc()
}

// Refused counts a refusal.
func (m *Metrics) Refused(reason string) {
	if m == nil {
		return
	}
	m.refusals.WithLabelValues(reason).Inc()
}

// SignalSent counts a wake-up sent to the other replicas.
func (m *Metrics) SignalSent() {
	if m == nil {
		return
	}
	m.signalsSent.Inc()
}

// SignalReceived counts a wake-up received from another replica.
func (m *Metrics) SignalReceived() {
	if m == nil {
		return
	}
	m.signalsReceived.Inc()
}

// SignalError counts a failed send or a lost or failed listen.
func (m *Metrics) SignalError(op string) {
	if m == nil {
		return
	}
	m.signalErrors.WithLabelValues(op).Inc()
}

// SignalListening says whether this replica listens for the others'
// wake-ups now.
func (m *Metrics) SignalListening(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.signalListening.WithLabelValues().Set(v)
}

// RefusalReason names the refusal a Connect error stands for, "" when it
// is not one (a refusal is the broker saying no, not failing).
func RefusalReason(err error) string {
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return "auth"
	case connect.CodePermissionDenied:
		return "role"
	case connect.CodeResourceExhausted:
		return "quota"
	}
	return ""
}

// ConnsRefusal is the reason for a connection the broker closed as soon
// as it was accepted, being over its connection caps: no request was read,
// so no other refusal counts it.
const ConnsRefusal = "conns"

// GuardReason names a refusal by the broker's HTTP guard (it checks
// tokens and bounds request bodies before the RPC layer): auth and role
// as for calls, httpguard for a body over its limit or the memory budget.
func GuardReason(err error) string {
	switch r := RefusalReason(err); r {
	case "auth", "role":
		return r
	}
	return "httpguard"
}

// Interceptor times every unary call and stream by procedure and code.
// Put it first (outermost) so refused calls are timed too.
func (m *Metrics) Interceptor() connect.Interceptor { return interceptor{m} }

type interceptor struct{ m *Metrics }

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		i.m.observeRPC(req.Spec().Procedure, err, start)
		return resp, err
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		err := next(ctx, conn)
		i.m.observeRPC(conn.Spec().Procedure, err, start)
		return err
	}
}

func (m *Metrics) observeRPC(proc string, err error, start time.Time) {
	if m == nil {
		return
	}
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
	}
	m.rpcDuration.WithLabelValues(proc, code).Observe(time.Since(start).Seconds())
}

// HTTP times the requests next serves that are not RPCs, labelled by the
// ServeMux pattern that took them ("unmatched" for none): bounded by the
// routes the broker registers, never by paths a client makes up. RPCs
// (pattern under /gpupass. or /grpc.) are left to Interceptor.
func (m *Metrics) HTTP(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		// ServeMux sets r.Pattern on the request it was handed.
		p := r.Pattern
		if strings.HasPrefix(p, "/gpupass.") || strings.HasPrefix(p, "/grpc.") {
			return
		}
		if p == "" {
			p = "unmatched"
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		m.httpDuration.WithLabelValues(p, strconv.Itoa(code)).Observe(time.Since(start).Seconds())
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach flush and deadlines.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush keeps streaming responses (log follows) streaming.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// scrapeCollector reads node and run counts when Prometheus scrapes.
type scrapeCollector struct {
	m   *Metrics
	src Sources
	mu  sync.Mutex // one store read at a time, however many scrapers
}

var (
	nodesDesc = prometheus.NewDesc(Namespace+"_nodes", "Enrolled nodes by region, state (online: a beat within the offline limit) and certified (last report passed).",
		[]string{"region", "state", "certified"}, nil)
	runsDesc = prometheus.NewDesc(Namespace+"_runs", "Runs (allocations) in the store by state.", []string{"state"}, nil)
	upDesc   = prometheus.NewDesc(Namespace+"_scrape_source_up", "Whether this scrape could read a source (nodes, runs): 1 yes, 0 its store read failed.",
		[]string{"source"}, nil)
)

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodesDesc
	ch <- runsDesc
	ch <- upDesc
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	up := func(source string, err error) {
		v := 1.0
		if err != nil {
			v = 0
			c.m.StoreError("metrics")
		}
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, v, source)
	}
	if c.src.Nodes != nil {
		counts, err := c.src.Nodes(ctx)
		up("nodes", err)
		for _, n := range counts {
			ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(n.Nodes),
				n.Region, n.State, strconv.FormatBool(n.Certified))
		}
	}
	if c.src.Runs != nil {
		counts, err := c.src.Runs(ctx)
		if errors.Is(err, ErrNoRuns) {
			return
		}
		up("runs", err)
		for st, n := range counts {
			ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(n), st)
		}
	}
}

// ErrNoRuns is what a Runs source returns when the store keeps no runs:
// the family is left out rather than reported down.
var ErrNoRuns = errors.New("store keeps no runs")
