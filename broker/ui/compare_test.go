package ui_test

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/report"
)

var (
	tbodyRE = regexp.MustCompile(`(?s)<table id="(compare-runs|compare-pairs)">.*?<tbody>(.*?)</tbody>`)
	rowRE   = regexp.MustCompile(`(?s)<tr>(.*?)</tr>`)
	cellRE  = regexp.MustCompile(`(?s)<td>(.*?)</td>`)
	tagRE   = regexp.MustCompile(`(?s)<div.*`)
	chartRE = regexp.MustCompile(`(?s)<div class="chart" id="compare-chart">(.*?)</div>`)
)

// TestCompareReadsAsTheCLI compares two runs of the broker with the
// CLI's use case (`gpupass compare ALLOC ALLOC`, its markdown) and on
// the dashboard's compare page: the pairs are named in the same order
// (the runs' order as given, the first the reference) and the cost,
// steps/s, wall time, max |Δ| and final difference read the same, with
// a throughput past three digits, a cost under a cent and one over.
func TestCompareReadsAsTheCLI(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "sqlite")
	s := db.Open(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC)
	// us logs 2812 steps/s, eu 188; eu drifts from us to 0.001234 at the
	// last step.
	put := func(id, region string, stepsPerSec, drift float64) {
		a := store.Alloc{ID: id, Name: "fmt", Region: region, State: store.AllocSucceeded, SpecJSON: []byte("{}"),
			PricePerHour: 3.5, Fence: 7, CreatedAt: t0, StartedAt: t0.Add(-time.Second), FinishedAt: t0.Add(time.Minute)}
		if err := s.(store.Runs).CreateAlloc(ctx, a); err != nil {
			t.Fatal(err)
		}
		var recs []store.RunRecord
		for st := int64(0); st <= 2800; st += 100 {
			m := events.Metric{Step: st, Attempt: 1, Time: t0.Add(time.Duration(float64(st) / stepsPerSec * float64(time.Second))),
				Values: map[string]float64{"loss": 2 - float64(st)/2000 + drift*float64(st)/2800}}
			data, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, store.RunRecord{Seq: uint64(len(recs) + 1), Kind: store.RecordMetric, Data: data})
		}
		if _, err := s.(store.Runs).AppendRecords(ctx, id, 7, recs); err != nil {
			t.Fatal(err)
		}
		if _, err := s.(store.Runs).UpdateAlloc(ctx, id, func(a *store.Alloc) error {
			a.LastSeq, a.HeldThrough = uint64(len(recs)), uint64(len(recs))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	put("alloc-fmt00001", "us-west-2", 2812, 0)
	put("alloc-fmt00002", "eu-central-1", 188, 0.001234)
	b := brokertest.Start(t, db, broker.Config{OfflineAfter: time.Hour})
	tok := b.Token(t, store.RoleRead, "*")

	svgFile := filepath.Join(t.TempDir(), "chart.svg")
	res, err := compare.Run(ctx, compare.Options{
		Runs:      []compare.Input{{Ref: "alloc-fmt00001"}, {Ref: "alloc-fmt00002"}},
		Tolerance: report.DefaultTolerance,
		Files:     compare.Files{SVG: svgFile},
		Source: &compare.BrokerSource{URL: b.URL, Dial: func() (*client.RunClients, error) {
			return client.DialRuns(b.URL, client.Options{Token: tok})
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	md := string(res.Markdown)

	br := newBrowser(t, b.URL)
	br.login(tok)
	resp, page := br.do("GET", "/ui/compare?run=alloc-fmt00001&run=alloc-fmt00002", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("compare page: %s\n%s", resp.Status, tail(page, 1500))
	}
	ui := map[string][][]string{}
	for _, m := range tbodyRE.FindAllStringSubmatch(page, -1) {
		for _, row := range rowRE.FindAllStringSubmatch(m[2], -1) {
			var cells []string
			for _, c := range cellRE.FindAllStringSubmatch(row[1], -1) {
				cells = append(cells, strings.TrimSpace(html.UnescapeString(tagRE.ReplaceAllString(c[1], ""))))
			}
			ui[m[1]] = append(ui[m[1]], cells)
		}
	}
	// The cells both show, by column: the markdown's and the page's.
	runCols := [][2]int{{0, 0}, {5, 5}, {6, 6}, {7, 7}, {8, 8}}
	pairCols := [][2]int{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}}
	pick := func(rows [][]string, cols [][2]int, side int) [][]string {
		var out [][]string
		for _, r := range rows {
			var o []string
			for _, c := range cols {
				if c[side] < len(r) {
					o = append(o, r[c[side]])
				}
			}
			out = append(out, o)
		}
		return out
	}
	mdRuns, mdPairs := mdTables(md)
	want := [][]string{
		{"us-west-2", "995ms", "2810", "1s", "$0.0019"},
		{"eu-central-1", "15s", "188", "1s", "$0.02"},
	}
	if d := cmp.Diff(want, pick(mdRuns, runCols, 0)); d != "" {
		t.Errorf("markdown runs (-want +got):\n%s\n%s", d, md)
	}
	if d := cmp.Diff(want, pick(ui["compare-runs"], runCols, 1)); d != "" {
		t.Errorf("dashboard runs (-want +got):\n%s", d)
	}
	want = [][]string{{"us-west-2 vs eu-central-1", "29", "0.00123 (step 2800)", "+0.21%", "none"}}
	if d := cmp.Diff(want, pick(mdPairs, pairCols, 0)); d != "" {
		t.Errorf("markdown pairs (-want +got):\n%s\n%s", d, md)
	}
	if d := cmp.Diff(want, pick(ui["compare-pairs"], pairCols, 1)); d != "" {
		t.Errorf("dashboard pairs (-want +got):\n%s", d)
	}
	// The page draws the chart `gpupass compare --svg` writes (the PR
	// comment's artifact), byte for byte.
	cli, err := os.ReadFile(svgFile)
	if err != nil {
		t.Fatal(err)
	}
	if m := chartRE.FindStringSubmatch(page); m == nil {
		t.Error("compare page has no chart")
	} else if d := cmp.Diff(strings.TrimSpace(string(cli)), strings.TrimSpace(m[1])); d != "" {
		t.Errorf("compare page's chart differs from compare --svg's (-cli +page):\n%s", d)
	}
	// The chart's legend lists the runs in the same order.
	if i, j := strings.Index(page, ">us-west-2</text>"), strings.Index(page, ">eu-central-1</text>"); i < 0 || j < i {
		t.Errorf("chart legend: us-west-2 at %d, eu-central-1 at %d; want both, us-west-2 first", i, j)
	}
}

// mdTables returns the body rows of the markdown's Runs and Pairs
// tables, cells trimmed (no cell here holds an escaped "|").
func mdTables(md string) (runs, pairs [][]string) {
	var cur *[][]string
	for _, line := range strings.Split(md, "\n") {
		switch {
		case line == "#### Runs":
			cur = &runs
		case line == "#### Pairs":
			cur = &pairs
		case cur != nil && strings.HasPrefix(line, "| "):
			var cells []string
			for _, c := range strings.Split(strings.Trim(line, "|"), " | ") {
				cells = append(cells, strings.TrimSpace(c))
			}
			*cur = append(*cur, cells)
		}
	}
	if len(runs) == 0 || len(pairs) == 0 {
		return nil, nil
	}
	// The first row of each is the header.
	return runs[1:], pairs[1:]
}
