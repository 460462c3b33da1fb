package executor_test

import (
	"context"
	"os"
	"strings"
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

// TestMetricsFileRewritten: an attempt after a restart that truncates,
// rewrites or replaces the metrics file instead of appending to it has
// its points read from the start of the new content, with a warning.
func TestMetricsFileRewritten(t *testing.T) {
	t.Parallel()
	const (
		three = "{\"step\":1,\"loss\":0.9}\n{\"step\":2,\"loss\":0.8}\n{\"step\":3,\"loss\":NaN}\n"
		four  = "{\"step\":3,\"loss\":0.7}\n{\"step\":4,\"loss\":0.6}\n{\"step\":5,\"loss\":0.5}\n{\"step\":6,\"loss\":0.4}\n"
	)
	write := func(t *testing.T, path, data string) {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	all := [][2]int64{{1, 1}, {2, 1}, {3, 1}, {3, 2}, {4, 2}, {5, 2}, {6, 2}}
	tests := []struct {
		name     string
		attempt2 func(t *testing.T, path string)
		want     [][2]int64
		how      string
	}{
		{"truncated", func(t *testing.T, path string) { write(t, path, four[:22]) }, all[:4], "truncated"},
		// Truncated and written past the old offset before the tail
		// looked: only the content tells.
		{"rewritten in place", func(t *testing.T, path string) { write(t, path, four) }, all, "rewritten"},
		{"replaced", func(t *testing.T, path string) {
			write(t, path+".new", four)
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
		}, all, "replaced"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runnerFunc(func(a executor.Attempt) executor.Exit {
				path := envValue(a.Env, executor.EnvMetricsFile)
				if envValue(a.Env, executor.EnvAttempt) == "1" {
					f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					if _, err := f.WriteString(three); err != nil {
						t.Fatal(err)
					}
				} else {
					tt.attempt2(t, path)
				}
				return executor.Exit{}
			})
			job := executor.Job{Command: []string{"train"}, MaxRestarts: 1}
			out := execute(t, context.Background(), job, &executor.Executor{Runner: r, MetricsPoll: time.Hour})
			if out.res.State != executor.Succeeded || out.res.Attempts != 2 {
				t.Fatalf("result %+v", out.res)
			}
			if diff := cmp.Diff(tt.want, metricSteps(out.metrics)); diff != "" {
				t.Errorf("points (step, attempt) -want +got:\n%s", diff)
			}
			want := []string{"GPUPASS_METRICS_FILE was " + tt.how + " after 66 bytes were read: reading it again from the start"}
			if diff := cmp.Diff(want, metricWarnings(out)); diff != "" {
				t.Errorf("metrics warnings -want +got:\n%s", diff)
			}
		})
	}
}

type runnerFunc func(executor.Attempt) executor.Exit

func (f runnerFunc) Run(_ context.Context, a executor.Attempt, _ func(executor.Line)) executor.Exit {
	return f(a)
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}
