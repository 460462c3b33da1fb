package brokermetrics_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/gpupass/gpupass/broker/brokermetrics"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/testutil/promtest"
)

func metric(t *testing.T, step int64, at time.Time, loss float64) []byte {
	b, err := json.Marshal(events.Metric{Step: step, Time: at, Values: map[string]float64{"loss": loss}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func expose(t *testing.T, m *brokermetrics.Metrics) []byte {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&buf, f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// TestRunGauges: off by default; when on, loss, step and step rate per
// run, at most the cap of runs, the least recently reporting dropped and
// counted.
func TestRunGauges(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	off := brokermetrics.New(brokermetrics.Sources{})
	off.RunMetric("alloc-a", "us", metric(t, 1, t0, 2))
	if _, ok := promtest.Parse(t, expose(t, off))["gpupass_broker_run_loss"]; ok {
		t.Fatal("run gauges exported without EnableRunGauges")
	}

	m := brokermetrics.New(brokermetrics.Sources{})
	m.EnableRunGauges(2)
	m.RunMetric("alloc-a", "us", metric(t, 10, t0, 2.5))
	m.RunMetric("alloc-b", "eu", metric(t, 1, t0, 9))
	m.RunMetric("alloc-a", "us", metric(t, 30, t0.Add(4*time.Second), 1.5)) // 20 steps in 4 s
	m.RunMetric("alloc-a", "us", []byte("not json"))                        // ignored, but no drop
	m.RunMetric("alloc-c", "eu", metric(t, 1, t0, 7))                       // over the cap: b reported least recently
	body := expose(t, m)
	promtest.CheckMetrics(t, body)
	fams := promtest.Parse(t, body)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
		found  bool
	}{
		{"gpupass_broker_run_loss", []string{"alloc=alloc-a", "region=us"}, 1.5, true},
		{"gpupass_broker_run_step", []string{"alloc=alloc-a"}, 30, true},
		{"gpupass_broker_run_steps_per_second", []string{"alloc=alloc-a"}, 5, true},
		{"gpupass_broker_run_loss", []string{"alloc=alloc-c"}, 7, true},
		{"gpupass_broker_run_loss", []string{"alloc=alloc-b"}, 0, false},
		{"gpupass_broker_run_series_dropped_total", nil, 1, true},
	} {
		got, ok := promtest.Value(fams, c.name, c.labels...)
		if ok != c.found || got != c.want {
			t.Errorf("%s%v = %v (found %t), want %v (found %t)", c.name, c.labels, got, ok, c.want, c.found)
		}
	}
}
