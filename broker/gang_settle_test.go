package broker

import (
	"context"
	"fmt"
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
			b, st := gangBroker(t, as)
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

// gangBroker is a broker over a new SQLite store holding as (a gang's
// ranks), for the tests that change them as the broker does.
func gangBroker(t *testing.T, as []store.Alloc) (*Broker, store.Runs) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.CreateAllocs(ctx, as); err != nil {
		t.Fatal(err)
	}
	return New(Config{Store: st, OfflineAfter: time.Hour, HeartbeatInterval: time.Minute}), st
}

// commitWatch is a store whose every committed change to a run is
// followed by check, as a reader of the store would see it then.
type commitWatch struct {
	store.Runs
	check func(when string)
}

func (w commitWatch) UpdateAlloc(ctx context.Context, id string, fn func(*store.Alloc) error) (store.Alloc, error) {
	a, err := w.Runs.UpdateAlloc(ctx, id, fn)
	w.check("after the change to " + id)
	return a, err
}

func (w commitWatch) UpdateAllocs(ctx context.Context, ids []string, fn func([]*store.Alloc) error) ([]store.Alloc, error) {
	as, err := w.Runs.UpdateAllocs(ctx, ids, fn)
	w.check("after the change to " + strings.Join(ids, ", "))
	return as, err
}

// TestFinishGangInOneChange: a gang that cannot be placed (no gang of its
// size in the region) fails as one change to the store: no reader ever
// has rank 0 failed and a rank still pending (so waiting for a gang that
// will never start), and a broker that stopped between two changes could
// not leave it so. It was two: rank 0 failed, then its ranks cancelled
// (TestGangForNodesAnotherReplicaJustSaw read rank 1 pending in between).
func TestFinishGangInOneChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var as []store.Alloc
	for i := range 3 {
		a := store.Alloc{ID: "alloc-g", Name: "g", Region: "eu-central-1", State: store.AllocPending, GangSize: 3, Rank: i}
		if i > 0 {
			a.ID, a.Gang = "alloc-g-r"+string(rune('0'+i)), "alloc-g"
		}
		as = append(as, a)
	}
	b, st := gangBroker(t, as)
	const why = "no gang of 3 nodes in eu-central-1: only 1 certified h100-sxm5 node, a gang needs 3"
	w := commitWatch{Runs: st}
	w.check = func(when string) {
		t.Helper()
		var states []string
		half := false
		for i, a := range as {
			got, err := st.Alloc(ctx, a.ID)
			if err != nil {
				t.Fatal(err)
			}
			states = append(states, fmt.Sprintf("rank %d %s", i, got.State))
			half = half || (i > 0 && !got.State.Terminal())
		}
		if half && strings.HasPrefix(states[0], "rank 0 "+string(store.AllocFailed)) {
			t.Errorf("%s: %s; want the gang ended in one change", when, strings.Join(states, ", "))
		}
	}
	out, err := b.finish(ctx, w, as[0], store.AllocFailed, why)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != store.AllocFailed || out.Reason != why {
		t.Errorf("the run: %s (%s), want failed: %s", out.State, out.Reason, why)
	}
	for _, a := range as[1:] {
		got, err := st.Alloc(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != store.AllocCancelled || got.NodeID != "" || !strings.Contains(got.Reason, why) {
			t.Errorf("%s: %s on %q (%s), want cancelled on no node naming %q", a.ID, got.State, got.NodeID, got.Reason, why)
		}
	}
}
