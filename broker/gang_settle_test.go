package broker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/sqlite"
)

// TestSettleGang (issue #34): a gang ends together. A rank that fails
// stops the others and the run fails naming it, whichever rank's report
// reaches the broker first when its peers fail with it; the run succeeds
// only when every rank did.
func TestSettleGang(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	type rank struct {
		state    store.AllocState
		reason   string
		done     bool // rank 0's own process succeeded
		finished time.Duration
	}
	for _, tc := range []struct {
		name       string
		ranks      []rank
		wantState  []store.AllocState
		wantCancel []bool
		wantReason string // rank 0's
	}{
		{"rank 1 fails: rank 0 is stopped, then fails naming rank 1",
			[]rank{{state: store.AllocRunning}, {state: store.AllocFailed, reason: "exited with code 3"}},
			[]store.AllocState{store.AllocRunning, store.AllocFailed}, []bool{true, false}, "rank 1 on agt-1: exited with code 3"},
		{"rank 0 and rank 1 fail together, rank 0's report first: both named, in that order",
			[]rank{{state: store.AllocFailed, reason: "exited with code 1", finished: time.Millisecond}, {state: store.AllocFailed, reason: "killed by signal killed", finished: 2 * time.Millisecond}, {state: store.AllocRunning}},
			[]store.AllocState{store.AllocFailed, store.AllocFailed, store.AllocRunning}, []bool{false, false, true},
			"rank 0 on agt-0: exited with code 1; rank 1 on agt-1: killed by signal killed"},
		{"rank 0 succeeded first: the run waits for rank 1",
			[]rank{{state: store.AllocRunning, done: true}, {state: store.AllocRunning}},
			[]store.AllocState{store.AllocRunning, store.AllocRunning}, []bool{false, false}, ""},
		{"every rank succeeded: so does the run",
			[]rank{{state: store.AllocRunning, done: true}, {state: store.AllocSucceeded}},
			[]store.AllocState{store.AllocSucceeded, store.AllocSucceeded}, []bool{false, false}, "every rank succeeded"},
		{"rank 0 succeeded, rank 1 failed: the run fails",
			[]rank{{state: store.AllocRunning, done: true}, {state: store.AllocFailed, reason: "exited with code 3"}},
			[]store.AllocState{store.AllocFailed, store.AllocFailed}, []bool{false, false}, "rank 1 on agt-1: exited with code 3"},
		{"a rank not started yet is cancelled",
			[]rank{{state: store.AllocFailed, reason: "exited with code 2"}, {state: store.AllocMatched}},
			[]store.AllocState{store.AllocFailed, store.AllocCancelled}, []bool{false, false}, "exited with code 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "broker.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			b := New(Config{Store: st, OfflineAfter: time.Hour, HeartbeatInterval: time.Minute})
			var as []store.Alloc
			for i, r := range tc.ranks {
				a := store.Alloc{ID: "alloc-g", Name: "g", Region: "us-west-2", State: r.state, Reason: r.reason, RankDone: r.done,
					NodeID: "agt-" + string(rune('0'+i)), GangSize: len(tc.ranks), Rank: i}
				if i > 0 {
					a.ID, a.Gang = "alloc-g-r"+string(rune('0'+i)), "alloc-g"
				}
				if a.State.Terminal() {
					a.FinishedAt = t0.Add(r.finished)
				}
				as = append(as, a)
			}
			if err := st.CreateAllocs(ctx, as); err != nil {
				t.Fatal(err)
			}
			b.settleGang(ctx, st, as[len(as)-1])
			for i, a := range as {
				got, err := st.Alloc(ctx, a.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.State != tc.wantState[i] || got.CancelRequested != tc.wantCancel[i] {
					t.Errorf("rank %d: %s cancel %v (%s), want %s cancel %v", i, got.State, got.CancelRequested, got.Reason, tc.wantState[i], tc.wantCancel[i])
				}
				if i == 0 && tc.wantReason != "" && got.Reason != tc.wantReason && !(got.CancelRequested && got.EndedBy == tc.wantReason) {
					t.Errorf("the run's reason %q (stopped for %q), want %q", got.Reason, got.EndedBy, tc.wantReason)
				}
				if i > 0 && tc.wantCancel[i] && !strings.HasPrefix(got.EndedBy, "rank ") {
					t.Errorf("rank %d stopped for %q, want the rank that ended named", i, got.EndedBy)
				}
			}
		})
	}
}
