package loadgen

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/events"
)

// TestEmit: the job prints every line and writes every metric point, to
// the metrics file when it has one and as gpupass:metric lines on stdout
// when not, each point a whole JSON line the executor parses.
func TestEmit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		file              bool
		rate, count, mrat int
		wantPoints        int
	}{
		{"file", true, 1000, 50, 100, 5},
		{"stdout", false, 1000, 50, 100, 5},
		{"no metrics", true, 1000, 20, 0, 0},
		{"at least one point", true, 1000, 5, 10, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var path string
			if tc.file {
				path = filepath.Join(t.TempDir(), "metrics.jsonl")
			}
			var out bytes.Buffer
			if err := Emit(&out, path, tc.rate, tc.count, tc.mrat); err != nil {
				t.Fatal(err)
			}
			var lines, metricLines []string
			for sc := bufio.NewScanner(&out); sc.Scan(); {
				if strings.HasPrefix(sc.Text(), events.MetricMarker) {
					metricLines = append(metricLines, sc.Text())
				} else {
					lines = append(lines, sc.Text())
				}
			}
			if len(lines) != tc.count {
				t.Errorf("%d lines printed, want %d", len(lines), tc.count)
			}
			if tc.file {
				b, err := os.ReadFile(path)
				if err != nil && tc.wantPoints > 0 {
					t.Fatal(err)
				}
				if len(metricLines) != 0 {
					t.Errorf("%d metric lines on stdout with a metrics file", len(metricLines))
				}
				metricLines = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
				if len(b) == 0 {
					metricLines = nil
				}
			}
			if len(metricLines) != tc.wantPoints {
				t.Fatalf("%d metric points written, want %d: %q", len(metricLines), tc.wantPoints, metricLines)
			}
			for i, l := range metricLines {
				m, err := events.ParseMetric([]byte(l), time.Now())
				if err != nil {
					t.Fatalf("point %d %q: %v", i, l, err)
				}
				if m.Step != int64(i) || m.Values[metricTag] != 1 {
					t.Errorf("point %d is step %d with values %v, want step %d tagged %q", i, m.Step, m.Values, i, metricTag)
				}
			}
		})
	}
}
