package uploader_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
)

// TestExecutorToSink wires a run the way the agent will: the executor
// appends through the uploader, which ships records while the job runs
// (through sink outages) and drains the rest at the end.
func TestExecutorToSink(t *testing.T) {
	t.Parallel()
	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	st := newStore(faults)
	u := &uploader.Uploader{AllocID: "alloc-up", Spool: sp, Sink: st, Batch: 500, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- u.Run(ctx) }()
	x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
	res, err := x.Execute(context.Background(), executor.Job{AllocID: "alloc-up", WorkRoot: t.TempDir(), Command: []string{"seq", "1", "5000"}}, u)
	if err != nil || res.State != executor.Succeeded {
		t.Fatalf("%+v %v", res, err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := u.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if uint64(len(st.data)) != res.LastSeq {
		t.Fatalf("sink holds %d records, the run spooled %d", len(st.data), res.LastSeq)
	}
	n := 0
	for seq := uint64(1); seq <= res.LastSeq; seq++ {
		e, err := executor.DecodeEvent(spool.Record{Seq: seq, Kind: spool.KindEvent, Data: []byte(st.data[seq])})
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		if e.Component == "stdout" {
			n++
			if e.Message != strconv.Itoa(n) {
				t.Fatalf("stdout line %d is %q", n, e.Message)
			}
		}
	}
	if n != 5000 {
		t.Errorf("%d stdout lines arrived, want 5000", n)
	}
}
