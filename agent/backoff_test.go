package agent_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent"
)

// delayLog keeps the "in" delay of each "broker unreachable" warning.
type delayLog struct {
	mu     sync.Mutex
	delays []time.Duration
	enough chan struct{}
	want   int
}

func (d *delayLog) Enabled(context.Context, slog.Level) bool { return true }
func (d *delayLog) WithAttrs([]slog.Attr) slog.Handler       { return d }
func (d *delayLog) WithGroup(string) slog.Handler            { return d }
func (d *delayLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "broker unreachable; retrying" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "in" {
			d.mu.Lock()
			d.delays = append(d.delays, a.Value.Duration())
			if len(d.delays) == d.want {
				close(d.enough)
			}
			d.mu.Unlock()
		}
		return true
	})
	return nil
}

// TestEnrollBackoffJitter starts two agents against a broker that is down
// (a closed port), as after a broker restart: their retry schedules must
// differ (jitter, so they do not come back in lockstep) and stay within
// the enroll loop's bounds, 500ms to 30s (issue #19).
func TestEnrollBackoffJitter(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	l.Close()
	const retries = 2
	var logs [2]*delayLog
	for i := range logs {
		logs[i] = &delayLog{enough: make(chan struct{}), want: retries}
		o := &agent.Options{
			BrokerURL: down, Token: "unused", StateDir: t.TempDir(), QueryAddr: "127.0.0.1:0",
			Provider: "sim", Region: "us-west-2", Zone: "us-west-2a", PricePerHour: 2.5, StorageClass: "standard", BandwidthGbps: 25,
			Python: systemPython, Simulate: "a100-80gb-4x", SuiteInterval: time.Hour, ReadProbeMB: 1,
		}
		if err := o.Validate(true); err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(o, slog.New(logs[i]))
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() { stop(); <-done })
	}
	var got [2][]time.Duration
	for i, d := range logs {
		select {
		case <-d.enough:
		case <-time.After(2 * time.Minute):
			t.Fatalf("agent %d logged %d enroll retries, want %d", i, len(d.delays), retries)
		}
		d.mu.Lock()
		got[i] = slices.Clone(d.delays[:retries])
		d.mu.Unlock()
		for _, w := range got[i] {
			if w < 500*time.Millisecond || w > 30*time.Second {
				t.Errorf("agent %d: retry delay %v outside the enroll bounds [500ms, 30s]", i, w)
			}
		}
	}
	t.Logf("retry delays: agent 0 %v, agent 1 %v", got[0], got[1])
	if slices.Equal(got[0], got[1]) {
		t.Errorf("both agents retry after %v: the same schedule, so they reconnect in lockstep", got[0])
	}
}
