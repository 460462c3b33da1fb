// Package promtest checks Prometheus expositions in tests: with the real
// promtool (Debian's prometheus package, scripts/setup.d/55-prometheus.sh)
// for the conventions, and with the exposition parser for values.
package promtest

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpupass/gpupass/internal/testutil"
)

// Scrape GETs url with an optional Bearer token and returns the body; it
// fails the test unless the answer is 200.
func Scrape(t testing.TB, url, token string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %s: %s", url, resp.Status, body)
	}
	return body
}

// CheckMetrics pipes an exposition into `promtool check metrics` and fails
// the test on any problem it reports (naming, units, help, types).
func CheckMetrics(t testing.TB, exposition []byte) {
	t.Helper()
	promtool := testutil.Tool(t, "promtool")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// Parse reads a text exposition into its families by name.
func Parse(t testing.TB, exposition []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(exposition))
	if err != nil {
		t.Fatalf("parsing exposition: %v", err)
	}
	return fams
}

// Value returns the value of the sample of family name whose labels
// include want ("k=v" pairs), summed over every matching sample, and
// whether any matched. Counters, gauges and untyped samples only.
func Value(fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	var sum float64
	found := false
	for _, m := range f.Metric {
		if !labelled(m, want) {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum, found
}

// Buckets returns the histogram samples of family name whose labels
// include want, summed: cumulative counts by upper bound, +Inf holding the
// count. Empty when none matched.
func Buckets(fams map[string]*dto.MetricFamily, name string, want ...string) map[float64]uint64 {
	out := map[float64]uint64{}
	f, ok := fams[name]
	if !ok {
		return out
	}
	for _, m := range f.Metric {
		if m.Histogram == nil || !labelled(m, want) {
			continue
		}
		for _, b := range m.Histogram.Bucket {
			if !math.IsInf(b.GetUpperBound(), 1) { // the text parser lists +Inf too: it is the count
				out[b.GetUpperBound()] += b.GetCumulativeCount()
			}
		}
		out[math.Inf(1)] += m.Histogram.GetSampleCount()
	}
	return out
}

// labelled reports whether m's labels include every "k=v" of want.
func labelled(m *dto.Metric, want []string) bool {
	have := map[string]string{}
	for _, l := range m.Label {
		have[l.GetName()] = l.GetValue()
	}
	for _, kv := range want {
		k, v, _ := strings.Cut(kv, "=")
		if have[k] != v {
			return false
		}
	}
	return true
}
