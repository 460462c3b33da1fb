package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
)

// metricSteps lists the step and attempt of every spooled point.
func metricSteps(ms []events.Metric) [][2]int64 {
	var out [][2]int64
	for _, m := range ms {
		out = append(out, [2]int64{m.Step, int64(m.Attempt)})
	}
	return out
}

func metricWarnings(o runOut) []string {
	var out []string
	for _, e := range o.find(events.MetricsComp) {
		if e.Level == events.Warn {
			out = append(out, e.Message)
		}
	}
	return out
}

// TestUnterminatedLastPoint: a job whose last metrics-file line has no
// newline still has that point recorded; a fragment left unterminated
// is dropped with a warning.
func TestUnterminatedLastPoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, write string
		want        [][2]int64
		warn        string
	}{
		{"complete point", `{"step":1,"loss":0.9}\n{"step":2,"loss":0.5}`, [][2]int64{{1, 1}, {2, 1}}, ""},
		{"fragment", `{"step":1,"loss":0.9}\n{"step":2,"lo`, [][2]int64{{1, 1}}, "GPUPASS_METRICS_FILE line 2: unterminated when attempt 1 ended, skipped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			job := executor.Job{Command: []string{"sh", "-c", `printf '` + tt.write + `' >> "$GPUPASS_METRICS_FILE"`}}
			out := execute(t, context.Background(), job, &executor.Executor{MetricsPoll: 10 * time.Millisecond})
			if out.res.State != executor.Succeeded {
				t.Fatalf("result %+v", out.res)
			}
			if diff := cmp.Diff(tt.want, metricSteps(out.metrics)); diff != "" {
				t.Errorf("points (step, attempt) -want +got:\n%s", diff)
			}
			var want []string
			if tt.warn != "" {
				want = []string{tt.warn}
			}
			if diff := cmp.Diff(want, metricWarnings(out)); diff != "" {
				t.Errorf("metrics warnings -want +got:\n%s", diff)
			}
		})
	}
}
