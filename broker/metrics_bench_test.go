package broker_test

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/internal/testutil"
)

// BenchmarkMetricsScrape measures one GET /metrics on a broker holding
// 10,000 nodes in six regions, as Prometheus scrapes it (gzip asked for,
// the dedicated token): wall time per scrape (p50, p95), this process's
// CPU per scrape (client included), and the bytes on the wire and of the
// exposition. Node counts come from the registry snapshot, run counts
// from one COUNT … GROUP BY.
func BenchmarkMetricsScrape(b *testing.B) {
	const secret = "bench-metrics-secret-0123"
	for _, kind := range brokertest.Stores {
		b.Run(fmt.Sprintf("store=%s/nodes=10000", kind), func(b *testing.B) {
			db := brokertest.NewDB(b, kind)
			populate(b, db.Open(b), 10000)
			time.Sleep(2500 * time.Millisecond) // past the refresh margin, as in BenchmarkDryRun
			cfg := brokertest.Fast()
			cfg.OfflineAfter, cfg.SnapshotTTL = 2*time.Hour, 0 // the default TTL: a background refresh
			cfg.Metrics.Token = secret
			srv := brokertest.Start(b, db, cfg)
			client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
			var wire, raw int
			scrape := func() {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
				req.Header.Set("Authorization", "Bearer "+secret)
				req.Header.Set("Accept-Encoding", "gzip")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("GET /metrics: %v %s", err, resp.Status)
				}
				wire = len(body)
			}
			scrape() // warm up: the first snapshot read
			lat := make([]time.Duration, 0, b.N)
			cpu0 := testutil.CPUTime()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				scrape()
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			b.ReportMetric(float64(testutil.CPUTime()-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
			b.ReportMetric(testutil.Percentile(lat, 0.50), "p50-ms")
			b.ReportMetric(testutil.Percentile(lat, 0.95), "p95-ms")
			b.ReportMetric(float64(wire), "wire-bytes")
			// The exposition itself, and a check that it counts them all.
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
			req.Header.Set("Authorization", "Bearer "+secret)
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				b.Fatal(err)
			}
			text, err := io.ReadAll(zr)
			resp.Body.Close()
			if err != nil {
				b.Fatal(err)
			}
			raw = len(text)
			b.ReportMetric(float64(raw), "exposition-bytes")
			if !strings.Contains(string(text), `gpupass_broker_nodes{certified="true",region="us-west-2",state="online"} 1667`) {
				b.Fatalf("the scrape does not count the fixture's nodes:\n%s", grepLines(string(text), "gpupass_broker_nodes"))
			}
		})
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
