package agentmetrics_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/gpupass/gpupass/agent/agentmetrics"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil/promtest"
)

func expose(t *testing.T, m *agentmetrics.Metrics) []byte {
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

// sink holds records up to a seq, or fails.
type sink struct {
	fail bool
}

func (s *sink) Upload(_ context.Context, _ string, recs []spool.Record) (uint64, error) {
	if s.fail {
		return 0, errors.New("broker away")
	}
	return recs[len(recs)-1].Seq, nil
}

// TestRunAndSpool: idle without a run; with one, its state, the spooled
// records not yet acknowledged and the upload lag while they wait; idle
// again once untracked. And the last suite run per check.
func TestRunAndSpool(t *testing.T) {
	t.Parallel()
	m := agentmetrics.New(nil)
	fams := promtest.Parse(t, expose(t, m))
	if v, _ := promtest.Value(fams, "gpupass_agent_run_state", "state=idle"); v != 1 {
		t.Fatalf("run_state{idle} = %v with no run, want 1", v)
	}

	sp, err := spool.Open(t.TempDir(), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	state := "starting"
	down := &sink{fail: true}
	wrapped, untrack := m.Track(sp, func() string { return state }, down)
	for range 5 {
		if _, _, err := sp.Append(spool.Record{Kind: 1, Data: []byte(`{"msg":"hello"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	state = "running"
	recs, err := sp.Pending(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrapped.Upload(t.Context(), "alloc-1", recs); err == nil {
		t.Fatal("failing sink did not fail")
	}
	time.Sleep(20 * time.Millisecond) // the lag must be measurably above 0
	body := expose(t, m)
	promtest.CheckMetrics(t, body)
	fams = promtest.Parse(t, body)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gpupass_agent_run_state", []string{"state=running"}, 1},
		{"gpupass_agent_run_state", []string{"state=idle"}, 0},
		{"gpupass_agent_spool_unacked_records", nil, 5},
		{"gpupass_agent_upload_errors_total", nil, 1},
		{"gpupass_agent_uploaded_records_total", nil, 0},
	} {
		if got, ok := promtest.Value(fams, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if lag, _ := promtest.Value(fams, "gpupass_agent_upload_lag_seconds"); lag <= 0 {
		t.Errorf("upload_lag_seconds = %v with 5 records waiting, want > 0", lag)
	}
	if b, _ := promtest.Value(fams, "gpupass_agent_spool_bytes"); b <= 0 {
		t.Errorf("spool_bytes = %v, want > 0", b)
	}

	down.fail = false
	held, err := wrapped.Upload(t.Context(), "alloc-1", recs)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Ack(held); err != nil {
		t.Fatal(err)
	}
	fams = promtest.Parse(t, expose(t, m))
	for _, c := range []struct {
		name string
		want float64
	}{{"gpupass_agent_spool_unacked_records", 0}, {"gpupass_agent_upload_lag_seconds", 0}, {"gpupass_agent_uploaded_records_total", 5}} {
		if got, _ := promtest.Value(fams, c.name); got != c.want {
			t.Errorf("after the ack: %s = %v, want %v", c.name, got, c.want)
		}
	}

	untrack()
	m.Conformance([]conformance.Check{
		{Name: "cuda", Status: conformance.Pass, DurationMS: 250},
		{Name: "storage", Status: conformance.Fail, DurationMS: 1500},
	}, 2*time.Second)
	body = expose(t, m)
	promtest.CheckMetrics(t, body)
	fams = promtest.Parse(t, body)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gpupass_agent_run_state", []string{"state=idle"}, 1},
		{"gpupass_agent_conformance_check_duration_seconds", []string{"check=storage"}, 1.5},
		{"gpupass_agent_conformance_check_passed", []string{"check=storage"}, 0},
		{"gpupass_agent_conformance_check_passed", []string{"check=cuda"}, 1},
		{"gpupass_agent_conformance_suite_duration_seconds", nil, 2},
		{"gpupass_agent_conformance_suite_runs_total", []string{"result=failed"}, 1},
	} {
		if got, ok := promtest.Value(fams, c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %t), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}
