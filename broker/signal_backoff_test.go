package broker

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// downSignals is a store whose listening connection fails at once, as
// while PostgreSQL restarts.
type downSignals struct{}

func (downSignals) Signal(context.Context, string) error { return nil }
func (downSignals) Listen(context.Context, func(), func(string)) error {
	return errors.New("connection refused")
}

// retryLog keeps the retry_in of each "listening again" warning.
type retryLog struct {
	mu     sync.Mutex
	delays []time.Duration
	enough chan struct{}
}

func (l *retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *retryLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *retryLog) WithGroup(string) slog.Handler            { return l }
func (l *retryLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "retry_in" {
			l.mu.Lock()
			if l.delays = append(l.delays, a.Value.Duration()); len(l.delays) == 2 {
				close(l.enough)
			}
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// TestListenSignalsBackoff: replicas cut off by the same PostgreSQL
// restart listen again after jittered waits within 1s..30s, so they do
// not all reconnect at the same instant. The doubling this replaced
// waited 1s, 2s, … on every replica alike.
func TestListenSignalsBackoff(t *testing.T) {
	t.Parallel()
	var got [2][]time.Duration
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := &retryLog{enough: make(chan struct{})}
			b := &Broker{log: slog.New(l), runs: newRunsState(), stop: make(chan struct{})}
			b.wg.Add(1)
			go b.listenSignals(newRelay(downSignals{}))
			select {
			case <-l.enough:
			case <-time.After(20 * time.Second):
			}
			close(b.stop)
			b.wg.Wait()
			l.mu.Lock()
			got[i] = slices.Clone(l.delays)
			l.mu.Unlock()
		}()
	}
	wg.Wait()
	for _, d := range got {
		if len(d) < 2 {
			t.Fatalf("retry delays %v: want two listen failures logged", got)
		}
		for _, w := range d {
			if w < time.Second || w > 30*time.Second {
				t.Errorf("retry delay %v, want within [1s, 30s]: %v", w, got)
			}
		}
	}
	if slices.Equal(got[0][:2], got[1][:2]) {
		t.Errorf("two replicas waited alike, %v: no jitter", got[0][:2])
	}
}
