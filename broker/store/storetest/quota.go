package storetest

import (
	"context"
	"testing"

	"github.com/gpupass/gpupass/broker/store"
)

// runLogUsage: the per-run quota reads log sizes from the records, the
// same from every handle (every replica), counting neither checkpoint
// chunks nor a record stored twice.
func runLogUsage(t *testing.T, open Factory) {
	t.Run("log usage of a run", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s, reopen := open(t)
		lu, ok := s.(store.LogUsage)
		if !ok {
			t.Fatalf("%T does not implement store.LogUsage", s)
		}
		r := runsOf(t, s)
		a := store.Alloc{ID: "alloc-quota", Name: "q", Region: "us-west-2", State: store.AllocRunning, NodeID: "agt-1", Fence: 1,
			SpecJSON: []byte(`{}`), Command: []string{"true"}, CreatedAt: t0}
		if err := r.CreateAlloc(ctx, a); err != nil {
			t.Fatal(err)
		}
		ev := func(seq uint64, n int) store.RunRecord {
			return store.RunRecord{Seq: seq, Kind: store.RecordEvent, Data: make([]byte, n)}
		}
		batch := []store.RunRecord{ev(1, 100), {Seq: 2, Kind: store.RecordMetric, Data: make([]byte, 20)},
			{Seq: 3, Kind: store.RecordCheckpoint, Data: make([]byte, 5000)}, ev(4, 7), ev(6, 1000)}
		if _, err := r.AppendRecords(ctx, a.ID, 1, batch); err != nil {
			t.Fatal(err)
		}
		// A retransmission with other bytes under a held seq changes nothing.
		if _, err := r.AppendRecords(ctx, a.ID, 1, []store.RunRecord{ev(1, 9999)}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name           string
			s              store.LogUsage
			after, through uint64
			above, within  int64
		}{
			{"all", lu, 0, 0, 1127, 0},
			{"through the gap-free mark", lu, 0, 4, 1127, 127},
			{"above a counted prefix", lu, 2, 4, 1007, 7},
			{"another handle", reopen(t).(store.LogUsage), 0, 6, 1127, 1127},
			{"unknown run", lu, 0, 10, 0, 0},
		} {
			id := a.ID
			if tc.name == "unknown run" {
				id = "alloc-none"
			}
			above, within, err := tc.s.LogBytes(ctx, id, tc.after, tc.through)
			if err != nil || above != tc.above || within != tc.within {
				t.Errorf("%s: LogBytes(%s, %d, %d) = %d, %d, %v; want %d, %d", tc.name, id, tc.after, tc.through, above, within, err, tc.above, tc.within)
			}
		}
	})
}
