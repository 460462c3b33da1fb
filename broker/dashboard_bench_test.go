package broker_test

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/testutil"
)

// BenchmarkDashboard measures the dashboard's pages (issue #20) on a
// broker holding 10,000 nodes and 10,000 runs: server time per page
// (p50, p95; on loopback, so it is the broker's time) and page weight.
// Pages are paginated (100 nodes, 50 runs) by the API's page tokens, so
// both stay flat as the fleet grows; the first and late pages of each
// list are measured.
func BenchmarkDashboard(b *testing.B) {
	const n = 10000
	db := brokertest.NewDB(b, "sqlite")
	s := db.Open(b)
	populate(b, s, n)
	rs, ok := s.(store.Runs)
	if !ok {
		b.Fatal("the sqlite store keeps no runs")
	}
	ctx := context.Background()
	t0 := time.Now().Add(-time.Duration(n) * time.Minute)
	for i := 0; i < n; i++ {
		at := t0.Add(time.Duration(i) * time.Minute)
		a := store.Alloc{ID: fmt.Sprintf("alloc-%08x", i), Name: fmt.Sprintf("bench-%d", i), Region: regions[i%len(regions)],
			State: store.AllocSucceeded, Reason: "exited with status 0", NodeID: fmt.Sprintf("agt-bench%06d", i%n), PricePerHour: 20,
			SpecJSON: []byte("{}"), SpecFingerprint: "sha256:bench", Command: []string{"python", "train.py"}, MaxRestarts: 3,
			Fence: uint64(i + 1), Attempts: 1, TokenID: "tok-bench", CreatedAt: at, UpdatedAt: at, StartedAt: at, FinishedAt: at.Add(30 * time.Second)}
		if err := rs.CreateAlloc(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(2500 * time.Millisecond) // past the registry's refresh window, as BenchmarkDryRun
	srv := brokertest.Start(b, db, broker.Config{OfflineAfter: 2 * time.Hour})
	tok := srv.Token(b, store.RoleRead, "*")
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(srv.URL+"/ui/login", url.Values{"token": {tok}})
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(resp.Request.URL.Path, "/ui/nodes") {
		b.Fatalf("login: %v %v", err, resp)
	}
	_ = resp.Body.Close()
	// A late page is reached as a reader reaches it, by following the
	// "next" link (the API pages by token, not by offset): page 100 of
	// the nodes, page 20 of the runs, and the last page of the runs
	// (older than the newest 1000, which the runs page could not reach
	// before ListRuns had page tokens).
	for _, pg := range []struct {
		name, start string
		clicks      int
	}{{"nodes", "/ui/nodes", 0}, {"nodes-page100", "/ui/nodes", 99}, {"runs", "/ui/runs", 0},
		{"runs-page20", "/ui/runs", 19}, {"runs-page200", "/ui/runs", 199}} {
		page := pg.start
		for range pg.clicks {
			page = nextPage(b, c, srv.URL+page)
		}
		b.Run(pg.name, func(b *testing.B) {
			var times []time.Duration
			size := 0
			for b.Loop() {
				start := time.Now()
				resp, err := c.Get(srv.URL + page)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				times = append(times, time.Since(start))
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %s", page, resp.Status)
				}
				size = len(body)
			}
			b.ReportMetric(testutil.Percentile(times, 0.50), "p50-ms")
			b.ReportMetric(testutil.Percentile(times, 0.95), "p95-ms")
			b.ReportMetric(float64(size)/1024, "page-KiB")
		})
	}
}

var nextPageRE = regexp.MustCompile(`<a href="([^"]+)" id="next-page">`)

// nextPage returns the path of the page's "next" link.
func nextPage(b *testing.B, c *http.Client, page string) string {
	b.Helper()
	resp, err := c.Get(page)
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	m := nextPageRE.FindSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		b.Fatalf("%s: %s, no next-page link", page, resp.Status)
	}
	return html.UnescapeString(string(m[1]))
}
