package broker

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
)

// TestGangMayRestart (issue #34): which end of a rank's attempt restarts
// its whole gang. A failure or NaN restarts while --max-restarts has some
// left, a lost node only with --resume-elsewhere; a time limit, a cancel
// and a rank the broker stopped itself never do.
func TestGangMayRestart(t *testing.T) {
	t.Parallel()
	base := store.Alloc{GangSize: 2, Rank: 1, MaxRestarts: 1}
	for _, tc := range []struct {
		name   string
		edit   func(*store.Alloc)
		reason string
		lost   bool
		want   bool
	}{
		{"a failure with a restart left", func(*store.Alloc) {}, "killed by signal killed", false, true},
		{"no restart left", func(a *store.Alloc) { a.Restarts = 1 }, "exited with status 1", false, false},
		{"the run's time limit", func(*store.Alloc) {}, "TIMEOUT: time limit 10m reached", false, false},
		{"cancelled by the user", func(a *store.Alloc) { a.CancelRequested = true }, "cancelled", false, false},
		{"stopped for another rank", func(a *store.Alloc) { a.EndedBy = "rank 0 on agt-0: exited" }, "cancelled", false, false},
		{"one node", func(a *store.Alloc) { a.GangSize = 0 }, "exited with status 1", false, false},
		{"a lost node without --resume-elsewhere", func(*store.Alloc) {}, "", true, false},
		{"a lost node with --resume-elsewhere, no restart left", func(a *store.Alloc) { a.ResumeElsewhere, a.Restarts = true, 1 }, "", true, true},
	} {
		a := base
		tc.edit(&a)
		if got := gangMayRestart(&a, tc.reason, tc.lost); got != tc.want {
			t.Errorf("%s: gangMayRestart %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRestartGang (issue #34): once a rank asked for a restart, the
// ranks still running are stopped, and only when every rank has ended is
// the gang queued again, each rank going on after the records the broker
// holds, away from the nodes it was lost on.
func TestRestartGang(t *testing.T) {
	t.Parallel()
	const why = "rank 1 on agt-1: killed by signal killed"
	gang := func() []*store.Alloc {
		r0 := &store.Alloc{ID: "alloc-g", State: store.AllocRunning, NodeID: "agt-0", GangSize: 2, MaxRestarts: 1, HeldThrough: 40, Attempts: 1}
		r1 := &store.Alloc{ID: "alloc-g-r1", Gang: "alloc-g", Rank: 1, State: store.AllocRunning, NodeID: "agt-1", GangSize: 2, MaxRestarts: 1, HeldThrough: 30, Attempts: 1}
		requeueRank(r1, why)
		return []*store.Alloc{r0, r1}
	}

	as := gang()
	var changed []string
	under, queued := restartGang(as, &changed)
	if !under || queued {
		t.Fatalf("rank 0 still running: under %v, queued %v; want a restart under way, not queued", under, queued)
	}
	if r0 := as[0]; !r0.CancelRequested || r0.GangRestart != why || !strings.Contains(r0.EndedBy, why) || r0.State != store.AllocRunning {
		t.Errorf("rank 0 while rank 1 restarts: %+v; want asked to stop, naming rank 1", *r0)
	}
	// Rank 0's agent reports its stop: it waits too.
	requeueRank(as[0], as[0].GangRestart)
	as[1].Replaced = []string{"agt-9"}
	changed = changed[:0]
	under, queued = restartGang(as, &changed)
	if !under || !queued {
		t.Fatalf("every rank stopped: under %v, queued %v; want the gang queued again", under, queued)
	}
	type view struct {
		State               store.AllocState
		NodeID, GangRestart string
		Restarts, Attempts  int
		ResumeAfterSeq      uint64
		CancelRequested     bool
		Replaced            []string
	}
	var got []view
	for _, x := range as {
		got = append(got, view{x.State, x.NodeID, x.GangRestart, x.Restarts, x.Attempts, x.ResumeAfterSeq, x.CancelRequested, x.Replaced})
		if !strings.HasPrefix(x.Reason, "gang restart 1 (attempt 2) from the last checkpoint: "+why) {
			t.Errorf("%s's reason %q", x.ID, x.Reason)
		}
	}
	want := []view{
		{store.AllocPending, "", "", 1, 2, 40, false, []string{"agt-9"}},
		{store.AllocPending, "", "", 1, 2, 30, false, []string{"agt-9"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("queued gang (-want +got):\n%s", d)
	}

	// A run that has ended is never restarted.
	as = gang()
	as[0].State = store.AllocCancelled
	if under, queued := restartGang(as, &changed); under || queued {
		t.Errorf("ended run: under %v, queued %v; want no restart", under, queued)
	}
	// Rank 0's own process had succeeded: it runs again with the gang.
	as = gang()
	as[0].RankDone = true
	if _, queued := restartGang(as, &changed); !queued || as[0].State != store.AllocPending || as[0].RankDone {
		t.Errorf("rank 0 done, rank 1 restarting: queued %v, rank 0 %s done %v; want both queued", queued, as[0].State, as[0].RankDone)
	}
}

// TestGangTimeLeft (issue #34): a restarted gang's attempt gets what is
// left of the run's time limit, not the whole limit again.
func TestGangTimeLeft(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		a    store.Alloc
		want int64
	}{
		{"first attempt", store.Alloc{GangSize: 2, TimeLimitSeconds: 100, StartedAt: now.Add(-40 * time.Second)}, 100},
		{"restarted 40 s in", store.Alloc{GangSize: 2, Restarts: 1, TimeLimitSeconds: 100, StartedAt: now.Add(-40 * time.Second)}, 60},
		{"restarted past the limit", store.Alloc{GangSize: 2, Restarts: 1, TimeLimitSeconds: 100, StartedAt: now.Add(-time.Hour)}, 1},
		{"no limit", store.Alloc{GangSize: 2, Restarts: 1, StartedAt: now.Add(-time.Hour)}, 0},
		{"one node", store.Alloc{Restarts: 1, TimeLimitSeconds: 100, StartedAt: now.Add(-40 * time.Second)}, 100},
	} {
		if got := gangTimeLeft(tc.a, now); got != tc.want {
			t.Errorf("%s: %d s, want %d", tc.name, got, tc.want)
		}
	}
}

// TestGangNodeLost (issue #34): a gang's node lost mid-run with
// --resume-elsewhere restarts the whole gang away from that node (the
// lost rank waits pending on no node, the other is asked to stop);
// without it, the run fails as before.
func TestGangNodeLost(t *testing.T) {
	t.Parallel()
	for _, elsewhere := range []bool{true, false} {
		t.Run(map[bool]string{true: "resume elsewhere", false: "no resume elsewhere"}[elsewhere], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			as := []store.Alloc{
				{ID: "alloc-g", Name: "g", Region: "us-west-2", State: store.AllocRunning, NodeID: "agt-0", GangSize: 2, ResumeElsewhere: elsewhere, HeldThrough: 12, LastSeq: 12},
				{ID: "alloc-g-r1", Gang: "alloc-g", Rank: 1, Name: "g/1", Region: "us-west-2", State: store.AllocRunning, NodeID: "agt-1", GangSize: 2, ResumeElsewhere: elsewhere, HeldThrough: 9, LastSeq: 9},
			}
			b, st := gangBroker(t, as)
			b.nodeLost(ctx, st, as[1], true, "")
			r0, err := st.Alloc(ctx, "alloc-g")
			if err != nil {
				t.Fatal(err)
			}
			r1, err := st.Alloc(ctx, "alloc-g-r1")
			if err != nil {
				t.Fatal(err)
			}
			if !elsewhere {
				if r1.State != store.AllocFailed || !r0.CancelRequested || r0.GangRestart != "" {
					t.Errorf("without --resume-elsewhere: rank 1 %s (%s), rank 0 cancel %v restart %q; want rank 1 failed, rank 0 stopped, no restart",
						r1.State, r1.Reason, r0.CancelRequested, r0.GangRestart)
				}
				return
			}
			if r1.State != store.AllocPending || r1.NodeID != "" || r1.ResumeAfterSeq != r1.HeldThrough || !slices.Contains(r1.Replaced, "agt-1") ||
				!strings.Contains(r1.GangRestart, "rank 1: node lost: agt-1 stopped sending heartbeats") {
				t.Errorf("lost rank 1: %s on %q after seq %d, replaced %v, restart %q; want pending on no node after the records held (%d), agt-1 avoided",
					r1.State, r1.NodeID, r1.ResumeAfterSeq, r1.Replaced, r1.GangRestart, r1.HeldThrough)
			}
			if r0.State != store.AllocRunning || !r0.CancelRequested || r0.GangRestart == "" {
				t.Errorf("rank 0 while the gang restarts: %s cancel %v restart %q; want asked to stop for the restart", r0.State, r0.CancelRequested, r0.GangRestart)
			}
		})
	}
}
