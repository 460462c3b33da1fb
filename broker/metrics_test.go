package broker_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"net/http"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/testutil/promtest"
)

// TestMetricsScrape: /metrics counts nodes by region, state and
// certified from the registry, times RPCs by procedure and code, counts
// refusals by reason, and passes promtool's checks, on both stores.
func TestMetricsScrape(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			agentTok := b.Token(t, store.RoleAgent, "*")
			brokertest.Register(t, b.URL, agentTok, brokertest.H100("us-east-1", 2))
			brokertest.Register(t, b.URL, agentTok, brokertest.H100("us-east-1", 2))
			brokertest.Register(t, b.URL, agentTok, brokertest.H100("eu-west-1", 2))
			brokertest.NewAgent(t, b.URL, agentTok, brokertest.H100("eu-west-1", 2)) // enrolled, never reported
			// A refused call: unknown token.
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if _, err := brokertest.Enroll(t.Context(), b.URL, "gpp_notatoken", key, brokertest.H100("us-east-1", 1)); err == nil {
				t.Fatal("enrolling with an unknown token worked")
			}

			body := promtest.Scrape(t, b.URL+"/metrics", b.Token(t, store.RoleRead, "*"))
			promtest.CheckMetrics(t, body)
			fams := promtest.Parse(t, body)
			for _, c := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{"gpupass_broker_nodes", []string{"region=us-east-1", "state=online", "certified=true"}, 2},
				{"gpupass_broker_nodes", []string{"region=eu-west-1", "certified=true"}, 1},
				{"gpupass_broker_nodes", []string{"region=eu-west-1", "certified=false"}, 1},
				{"gpupass_broker_nodes", nil, 4},
				{"gpupass_broker_refusals_total", []string{"reason=auth"}, 1},
				{"gpupass_broker_scrape_source_up", []string{"source=nodes"}, 1},
				{"gpupass_broker_scrape_source_up", []string{"source=runs"}, 1},
				// 3 reports uploaded (a histogram's value here is its count).
				{"gpupass_broker_rpc_duration_seconds", []string{"procedure=/gpupass.v1.AgentService/UploadReport", "code=ok"}, 3},
			} {
				got, ok := promtest.Value(fams, c.name, c.labels...)
				if !ok || got != c.want {
					t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, got, ok, c.want)
				}
			}
			if _, ok := fams["gpupass_broker_heartbeat_lag_seconds"]; !ok {
				t.Error("no gpupass_broker_heartbeat_lag_seconds family")
			}
			// One broker on SQLite has no replicas to listen to: no
			// sample that an alert on "not listening" would fire on.
			if _, ok := fams["gpupass_broker_signal_listening"]; ok != (kind == "postgres") {
				t.Errorf("%s: gpupass_broker_signal_listening present %t, want %t", kind, ok, kind == "postgres")
			}
		})
	}
}

// TestMetricsAuth: who may scrape. The counts span every region, so only
// the dedicated secret or a read/admin token scoped to '*' may.
func TestMetricsAuth(t *testing.T) {
	t.Parallel()
	const secret = "metrics-secret-0123456789"
	cfg := brokertest.Fast()
	cfg.Metrics.Token = secret
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	pub := brokertest.Fast()
	pub.Metrics.Public = true
	open := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), pub)
	for _, c := range []struct {
		name, url, token string
		want             int
	}{
		{"no token", b.URL, "", http.StatusUnauthorized},
		{"unknown token", b.URL, "gpp_nope", http.StatusUnauthorized},
		{"agent token", b.URL, b.Token(t, store.RoleAgent, "*"), http.StatusUnauthorized},
		{"read token of one region", b.URL, b.Token(t, store.RoleRead, "us-*"), http.StatusUnauthorized},
		{"read token of every region", b.URL, b.Token(t, store.RoleRead, "*"), http.StatusOK},
		{"admin token", b.URL, b.Token(t, store.RoleAdmin, "*"), http.StatusOK},
		{"metrics secret", b.URL, secret, http.StatusOK},
		{"public", open.URL, "", http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, c.url+"/metrics", nil)
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("GET /metrics with %s: %s, want %d", c.name, resp.Status, c.want)
			}
		})
	}
	// A refused scrape is a refusal like any other.
	fams := promtest.Parse(t, promtest.Scrape(t, b.URL+"/metrics", secret))
	if n, _ := promtest.Value(fams, "gpupass_broker_refusals_total", "reason=auth"); n < 4 {
		t.Errorf("refusals_total{reason=auth} = %v, want >= 4 (the refused scrapes)", n)
	}
	// The non-RPC paths are timed by route, the secret is in no label.
	if n, ok := promtest.Value(fams, "gpupass_broker_http_request_duration_seconds", "handler=GET /metrics", "code=401"); !ok || n < 4 {
		t.Errorf("http_request_duration_seconds{handler=GET /metrics,code=401} count = %v, want >= 4", n)
	}
}

// TestIngestedCountsARecordOnce: an agent that lost the broker's reply
// sends the same batch again, which the store takes as a no-op; the
// ingest counter counts what was stored, so a resent record is not
// counted twice (Prometheus e2e compares it to the run's last seq).
func TestIngestedCountsARecordOnce(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	node := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
	node.keepAlive(t)
	run := submit(t, dialRuns(t, b, b.Token(t, store.RoleSubmit, "us-*")), "us-west-2", nil)
	as := node.poll(t, 5)
	if as == nil || as.AllocId != run.Id {
		t.Fatalf("assignment = %v", as)
	}
	for _, batch := range [][]*gpupassv1.Record{records(1, 3), records(1, 3), records(2, 5)} {
		if _, err := node.uploadFull(as, batch); err != nil {
			t.Fatal(err)
		}
	}
	fams := promtest.Parse(t, promtest.Scrape(t, b.URL+"/metrics", b.Token(t, store.RoleRead, "*")))
	if got, ok := promtest.Value(fams, "gpupass_broker_records_ingested_total"); !ok || got != 5 {
		t.Errorf("gpupass_broker_records_ingested_total = %v (found %t), want 5: seqs 1..5 once each", got, ok)
	}
}
