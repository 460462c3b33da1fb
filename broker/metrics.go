package broker

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gpupass/gpupass/broker/brokermetrics"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
)

// MetricsConfig configures GET /metrics (Prometheus exposition format) on
// the broker's port.
//
// Who may scrape: the counts span every region, so /metrics takes the
// dedicated scrape secret (Token, from --metrics-token-file; Prometheus
// sends it with authorization.credentials_file), or a broker token of
// role read or admin scoped to every region ('*'), as a Bearer token. Public
// serves it to anyone: only for a private network or loopback.
type MetricsConfig struct {
	Token  string
	Public bool
	// RunGauges exports each run's last loss, step and step rate as
	// gauges labelled by allocation, for at most RunGaugesMax runs
	// (brokermetrics.DefaultRunGaugeSeries when zero).
	RunGauges    bool
	RunGaugesMax int
}

// Metrics returns the broker's metrics (tests and benchmarks gather from
// its registry).
func (b *Broker) Metrics() *brokermetrics.Metrics { return b.metrics }

func (b *Broker) newMetrics() *brokermetrics.Metrics {
	src := brokermetrics.Sources{Nodes: b.nodeCounts, Runs: b.runCounts}
	m := brokermetrics.New(src)
	if b.cfg.Metrics.RunGauges {
		m.EnableRunGauges(b.cfg.Metrics.RunGaugesMax)
	}
	return m
}

// nodeCounts counts the registry snapshot's nodes: a walk over memory the
// broker keeps anyway for matching, so a scrape costs no store read
// unless the snapshot is due for its refresh.
func (b *Broker) nodeCounts(ctx context.Context) ([]brokermetrics.NodeCount, error) {
	snap, err := b.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	type key struct {
		region, state string
		certified     bool
	}
	counts := map[key]int{}
	now := time.Now()
	for _, n := range snap.nodes {
		k := key{region: n.Labels.Region, state: "offline", certified: n.HasReport && n.Index.Passed}
		if b.nodeOnline(snap, n.ID, now) {
			k.state = "online"
		}
		counts[k]++
	}
	out := make([]brokermetrics.NodeCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, brokermetrics.NodeCount{Region: k.region, State: k.state, Certified: k.certified, Nodes: n})
	}
	return out, nil
}

// allocCounter is implemented by stores that count runs by state in one
// query (sqlstore: COUNT … GROUP BY state).
type allocCounter interface {
	CountAllocsByState(ctx context.Context) (map[store.AllocState]int64, error)
}

func (b *Broker) runCounts(ctx context.Context) (map[string]int64, error) {
	c, ok := b.store.(allocCounter)
	if !ok {
		return nil, brokermetrics.ErrNoRuns
	}
	counts, err := c.CountAllocsByState(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(counts))
	for st, n := range counts {
		out[string(st)] = n
	}
	return out, nil
}

// metricsHandler serves /metrics to the scrapers MetricsConfig allows.
func (b *Broker) metricsHandler() http.Handler {
	h := b.metrics.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !b.cfg.Metrics.Public {
			if err := b.metricsAuth(r.Context(), r.Header.Get(api.AuthHeader)); err != nil {
				b.metrics.Refused("auth")
				b.log.Info("refused metrics scrape", "peer", r.RemoteAddr, "err", err)
				w.Header().Set("WWW-Authenticate", `Bearer realm="gpupass-broker metrics"`)
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

func (b *Broker) metricsAuth(ctx context.Context, header string) error {
	scheme, secret, _ := strings.Cut(header, " ")
	secret = strings.TrimSpace(secret)
	if !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return errors.New("metrics need a token: send " + api.AuthHeader + ": Bearer <the broker's metrics token, or a read or admin token for every region>")
	}
	if want := b.cfg.Metrics.Token; want != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(want)) == 1 {
		return nil
	}
	t, err := b.authenticate(ctx, header)
	if err != nil {
		return errors.New("metrics token not accepted: neither the broker's metrics token nor a token known to this broker")
	}
	if (t.Role != store.RoleRead && t.Role != store.RoleAdmin) || !slices.Contains(t.Regions, "*") {
		return errors.New("token " + t.ID + " may not read metrics: they span every region, so it takes role read or admin with region scope '*' (or the broker's metrics token)")
	}
	return nil
}

// noteIngested counts the records of an upload that were stored (the
// disputed ones were not) and feeds metric records to the run gauges.
// heldBefore is the run's HeldThrough before this upload: a seq at or
// below it was stored by an earlier upload, and this one is a resend
// (the agent lost the reply), which the store takes as a no-op.
func (b *Broker) noteIngested(a store.Alloc, heldBefore uint64, recs []store.RunRecord, disputed []uint64) {
	type tally struct{ n, bytes int }
	var by [4]tally // indexed by store.RecordKind (1 event, 2 metric, 3 checkpoint)
	for _, r := range recs {
		if r.Seq <= heldBefore || slices.Contains(disputed, r.Seq) || int(r.Kind) >= len(by) {
			continue
		}
		by[r.Kind].n++
		by[r.Kind].bytes += len(r.Data)
		if r.Kind == store.RecordMetric {
			b.metrics.RunMetric(a.ID, a.Region, r.Data)
		}
	}
	for k, t := range by {
		if t.n > 0 {
			b.metrics.Ingested(recordKindName[k], t.n, t.bytes)
		}
	}
}

var recordKindName = [4]string{"unknown", "event", "metric", "checkpoint"}
