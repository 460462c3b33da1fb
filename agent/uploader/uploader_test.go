package uploader_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
)

// store is a fake Sink with the broker's contract: it stores by (run,
// seq) idempotently and answers the highest contiguous seq it holds. Its
// faults are deterministic by call number.
type store struct {
	mu        sync.Mutex
	data      map[uint64]string
	calls     int
	received  int // records received, duplicates included
	fail      func(call int) string
	overclaim bool
}

func newStore(fail func(int) string) *store {
	return &store{data: map[uint64]string{}, fail: fail}
}

func (s *store) Upload(_ context.Context, alloc string, recs []spool.Record) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	mode := ""
	if s.fail != nil {
		mode = s.fail(s.calls)
	}
	if mode == "down" {
		return 0, errors.New("connection refused")
	}
	if mode == "refused" {
		return 0, fmt.Errorf("lease moved: %w", uploader.ErrRefused)
	}
	if mode == "half" {
		recs = recs[:(len(recs)+1)/2]
	}
	for _, r := range recs {
		s.received++
		if old, ok := s.data[r.Seq]; ok && old != string(r.Data) {
			return 0, fmt.Errorf("seq %d sent again with other data", r.Seq)
		}
		s.data[r.Seq] = string(r.Data)
	}
	if mode == "lost-reply" {
		return 0, errors.New("reply lost")
	}
	held := uint64(0)
	for {
		if _, ok := s.data[held+1]; !ok {
			break
		}
		held++
	}
	if s.overclaim {
		held += 10
	}
	return held, nil
}

func fill(t *testing.T, sp *spool.Spool, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if _, _, err := sp.Append(spool.Record{Kind: spool.KindEvent, Data: []byte(fmt.Sprintf("event-%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
}

func check(t *testing.T, st *store, n int) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.data) != n {
		t.Fatalf("sink holds %d records, want %d", len(st.data), n)
	}
	for i := 1; i <= n; i++ {
		if st.data[uint64(i)] != fmt.Sprintf("event-%d", i) {
			t.Fatalf("seq %d holds %q", i, st.data[uint64(i)])
		}
	}
}

func faults(call int) string {
	switch {
	case call%3 == 0:
		return "down"
	case call%5 == 0:
		return "lost-reply"
	case call%7 == 0:
		return "half"
	}
	return ""
}

func TestDrainThroughFaults(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	sp, err := spool.Open(dir, spool.Options{SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, sp, 1, 3000)
	st := newStore(faults)
	u := &uploader.Uploader{AllocID: "alloc-1", Spool: sp, Sink: st, Batch: 100, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	if err := u.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	check(t, st, 3000)
	if s := sp.Stats(); s.Acked != 3000 || s.Pending != 0 || s.Segments != 1 {
		t.Errorf("spool after drain: %+v", s)
	}
	if st.received <= 3000 {
		t.Errorf("received %d records: the faults did not cause resends, so the test proves little", st.received)
	}
	sp.Close()
}

// TestRestartResumes: the agent stops mid-upload (ctx cancelled, spool
// closed), comes back, and the sink ends with every record once.
func TestRestartResumes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	st := newStore(faults)
	for round := 0; round < 4; round++ {
		sp, err := spool.Open(dir, spool.Options{SegmentSize: 2048})
		if err != nil {
			t.Fatal(err)
		}
		fill(t, sp, round*500+1, round*500+500)
		ctx, cancel := context.WithCancel(context.Background())
		u := &uploader.Uploader{AllocID: "alloc-1", Spool: sp, Sink: st, Batch: 37, Poll: time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
		done := make(chan error, 1)
		go func() { done <- u.Run(ctx) }()
		// Stop somewhere in the middle of this round's upload.
		for {
			st.mu.Lock()
			n := len(st.data)
			st.mu.Unlock()
			if n >= round*500+250 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v", err)
		}
		sp.Close()
	}
	sp, err := spool.Open(dir, spool.Options{SegmentSize: 2048})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	u := &uploader.Uploader{AllocID: "alloc-1", Spool: sp, Sink: st, MinBackoff: time.Millisecond}
	if err := u.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	check(t, st, 2000)
}

func TestKickDuringRun(t *testing.T) {
	t.Parallel()
	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	st := newStore(nil)
	u := &uploader.Uploader{AllocID: "alloc-1", Spool: sp, Sink: st, Poll: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- u.Run(ctx) }()
	for i := 1; i <= 5; i++ {
		fill(t, sp, i, i)
		u.Kick()
		deadline := time.Now().Add(10 * time.Second)
		for sp.Stats().Acked < uint64(i) {
			if time.Now().After(deadline) {
				t.Fatalf("record %d not uploaded after a kick", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	cancel()
	<-done
	check(t, st, 5)
}

func TestSinkContractViolations(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		prep func(st *store)
		want string
	}{
		{"claims more than sent", func(st *store) { st.overclaim = true }, "claims to hold seq 15, but only 5 were sent"},
		{"lost acknowledged records", func(st *store) {}, "the sink lost records it acknowledged"},
		// Without the stop, Drain would retry until its context ends.
		{"refuses the run for good", func(st *store) { st.fail = func(int) string { return "refused" } }, "lease moved: the control plane refuses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"), spool.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer sp.Close()
			fill(t, sp, 1, 5)
			st := newStore(nil)
			tt.prep(st)
			u := &uploader.Uploader{AllocID: "alloc-1", Spool: sp, Sink: st}
			if tt.name == "lost acknowledged records" {
				if err := u.Drain(context.Background()); err != nil {
					t.Fatal(err)
				}
				fill(t, sp, 6, 8)
				st.mu.Lock()
				st.data = map[uint64]string{} // restored from an old backup
				st.mu.Unlock()
			}
			err = u.Drain(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want %q", err, tt.want)
			}
			if strings.HasPrefix(tt.name, "refuses") && !errors.Is(err, uploader.ErrRefused) {
				t.Errorf("error %v does not wrap ErrRefused", err)
			}
		})
	}
}
