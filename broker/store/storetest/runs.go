package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpupass/gpupass/broker/store"
)

func runsOf(t *testing.T, s store.Store) store.Runs {
	t.Helper()
	r, ok := s.(store.Runs)
	if !ok {
		t.Fatalf("%T does not implement store.Runs", s)
	}
	return r
}

func recs(from, to uint64) []store.RunRecord {
	var out []store.RunRecord
	for i := from; i <= to; i++ {
		out = append(out, store.RunRecord{Seq: i, Kind: store.RecordEvent, Data: fmt.Appendf(nil, `{"msg":"line %d"}`, i)})
	}
	return out
}

// runRuns is the allocation and record part of the contract.
func runRuns(t *testing.T, open Factory, o Options) {
	ctx := context.Background()

	t.Run("alloc lifecycle round trip", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r := runsOf(t, s)
		a := store.Alloc{ID: "alloc-00000001", Name: "bert-us-west-2", Region: "us-west-2", State: store.AllocPending,
			SpecJSON: []byte(`{"name":"bert"}`), Command: []string{"python3", "train.py"}, Workdir: []byte{0x1f, 0x8b, 0},
			MaxRestarts: 3, GraceSeconds: 10, TimeLimitSeconds: 5400, MaxPrice: 30, MinScore: 85, CreatedAt: t0, TokenID: "tok-1"}
		if err := r.CreateAlloc(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := r.CreateAlloc(ctx, a); err == nil {
			t.Error("a second allocation with the same id was accepted")
		}
		got, err := r.UpdateAlloc(ctx, a.ID, func(x *store.Alloc) error {
			x.State, x.NodeID, x.Fence, x.ScoreJSON = store.AllocMatched, "agt-1", 1, []byte(`{"score":97}`)
			return nil
		})
		if err != nil || got.State != store.AllocMatched || got.Fence != 1 {
			t.Fatalf("UpdateAlloc = %+v, %v", got, err)
		}
		boom := errors.New("refused")
		if _, err := r.UpdateAlloc(ctx, a.ID, func(x *store.Alloc) error { x.State = store.AllocFailed; return boom }); !errors.Is(err, boom) {
			t.Fatalf("UpdateAlloc with failing fn: err = %v, want it returned", err)
		}
		if _, err := r.UpdateAlloc(ctx, "alloc-nope", func(*store.Alloc) error { return nil }); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("UpdateAlloc of unknown id: err = %v, want ErrNotFound", err)
		}
		// A restarted broker reads the same allocation back.
		back, err := runsOf(t, reopen(t)).Alloc(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		w, err := r.Workdir(ctx, a.ID)
		if err != nil || !cmp.Equal(w, a.Workdir) {
			t.Errorf("Workdir = %x, %v; want %x", w, err, a.Workdir)
		}
		want := a
		want.Workdir = nil
		want.State, want.NodeID, want.Fence, want.ScoreJSON = store.AllocMatched, "agt-1", 1, []byte(`{"score":97}`)
		if diff := cmp.Diff(want, back, cmpopts.IgnoreFields(store.Alloc{}, "UpdatedAt")); diff != "" {
			t.Errorf("Alloc after reopen (-want +got):\n%s", diff)
		}
		if _, err := r.Alloc(ctx, "alloc-nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Alloc of unknown id: err = %v, want ErrNotFound", err)
		}
	})

	t.Run("active and listed allocs", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		r := runsOf(t, s)
		for i, st := range []store.AllocState{store.AllocPending, store.AllocRunning, store.AllocSucceeded, store.AllocFailed, store.AllocMatched} {
			a := store.Alloc{ID: fmt.Sprintf("alloc-%08d", i), Name: "n", Region: "us-west-2", State: st, CreatedAt: t0.Add(time.Duration(i) * time.Second)}
			if err := r.CreateAlloc(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		active, err := r.ActiveAllocs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, a := range active {
			ids = append(ids, a.ID)
		}
		if diff := cmp.Diff([]string{"alloc-00000000", "alloc-00000001", "alloc-00000004"}, ids); diff != "" {
			t.Errorf("ActiveAllocs (-want +got):\n%s", diff)
		}
		list, err := r.ListAllocs(ctx, 2, nil)
		if err != nil || len(list) != 2 || list[0].ID != "alloc-00000004" || list[1].ID != "alloc-00000003" {
			t.Errorf("ListAllocs(2) = %v, %v; want the newest two, newest first", list, err)
		}
		// The scope applies before the limit: the newest runs of the
		// regions asked for, however many newer ones elsewhere.
		for i := range 2 {
			a := store.Alloc{ID: fmt.Sprintf("alloc-e%07d", i), Name: "n", Region: "eu-central-1", State: store.AllocSucceeded, CreatedAt: t0.Add(time.Duration(i-10) * time.Second)}
			if err := r.CreateAlloc(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		eu := func(region string) bool { return region == "eu-central-1" }
		if list, err := r.ListAllocs(ctx, 1, eu); err != nil || len(list) != 1 || list[0].ID != "alloc-e0000001" {
			t.Errorf("ListAllocs(1, eu) = %v, %v; want alloc-e0000001, eu's newest, behind 5 newer us runs", list, err)
		}
		if list, err := r.ListAllocs(ctx, 10, eu); err != nil || len(list) != 2 {
			t.Errorf("ListAllocs(10, eu) = %v, %v; want eu's 2 runs", list, err)
		}
		if list, err := r.ListAllocs(ctx, 10, nil); err != nil || len(list) != 7 {
			t.Errorf("ListAllocs(10, all) = %d runs, %v; want 7", len(list), err)
		}
		if list, err := r.ListAllocs(ctx, 5, func(string) bool { return false }); err != nil || len(list) != 0 {
			t.Errorf("ListAllocs with no region in scope = %v, %v; want none", list, err)
		}
	})

	t.Run("a group's runs are found by group, oldest first", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r := runsOf(t, s)
		for i, g := range []string{"group-a", "group-b", "group-a", "", "group-a"} {
			a := store.Alloc{ID: fmt.Sprintf("alloc-g%07d", i), Name: "n", Region: "us-west-2", Group: g, State: store.AllocPending,
				CreatedAt: t0.Add(time.Duration(i) * time.Second)}
			if err := r.CreateAlloc(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		ids := func(as []store.Alloc) (out []string) {
			for _, a := range as {
				out = append(out, a.ID+"/"+a.Group)
			}
			return out
		}
		got, err := runsOf(t, reopen(t)).GroupAllocs(ctx, "group-a", 10)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"alloc-g0000000/group-a", "alloc-g0000002/group-a", "alloc-g0000004/group-a"}, ids(got)); diff != "" {
			t.Errorf("GroupAllocs(group-a) (-want +got):\n%s", diff)
		}
		if got, err := r.GroupAllocs(ctx, "group-a", 2); err != nil || len(got) != 2 {
			t.Errorf("GroupAllocs(group-a, 2) = %v, %v; want the oldest 2", ids(got), err)
		}
		// Runs stored before groups have none: '' is no group.
		if got, err := r.GroupAllocs(ctx, "", 10); err != nil || len(got) != 0 {
			t.Errorf("GroupAllocs('') = %v, %v; want none", ids(got), err)
		}
		if got, err := r.GroupAllocs(ctx, "group-nope", 10); err != nil || len(got) != 0 {
			t.Errorf("GroupAllocs(unknown) = %v, %v; want none", ids(got), err)
		}
	})

	t.Run("a group's CI context is set once", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r := runsOf(t, s)
		ci := []byte(`{"forge":"github","repository":"acme/train","pull_request":7}`)
		if err := r.SetGroupCI(ctx, "group-ci", "tok-1", ci); err != nil {
			t.Fatal(err)
		}
		// The first context stays: a group's is never replaced.
		if err := r.SetGroupCI(ctx, "group-ci", "tok-1", []byte(`{"forge":"github","repository":"evil/x"}`)); err == nil {
			t.Errorf("a second SetGroupCI of one group succeeded")
		}
		if got, err := runsOf(t, reopen(t)).GroupCI(ctx, "group-ci"); err != nil || string(got) != string(ci) {
			t.Errorf("GroupCI = %s, %v; want %s", got, err, ci)
		}
		if got, err := r.GroupCI(ctx, "group-none"); err != nil || got != nil {
			t.Errorf("GroupCI(unknown) = %s, %v; want nil", got, err)
		}
	})

	t.Run("records are idempotent, fenced and gap-aware", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		r := runsOf(t, s)
		if err := r.CreateAlloc(ctx, store.Alloc{ID: "alloc-0000000a", Name: "n", Region: "eu-central-1", State: store.AllocRunning, Fence: 2}); err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			name  string
			fence uint64
			recs  []store.RunRecord
			held  uint64
			err   error
		}{
			{"first batch", 2, recs(1, 100), 100, nil},
			{"same batch again after a lost reply", 2, recs(1, 100), 100, nil},
			{"overlapping batch", 2, recs(90, 150), 150, nil},
			{"batch after a gap is stored, mark stays", 2, recs(160, 170), 150, nil},
			{"gap filled", 2, recs(151, 159), 170, nil},
			{"stale fence", 1, recs(171, 180), 170, store.ErrStaleFence},
			{"empty batch reports the mark", 2, nil, 170, nil},
		}
		for _, st := range steps {
			res, err := r.AppendRecords(ctx, "alloc-0000000a", st.fence, st.recs)
			if !errors.Is(err, st.err) || (err == nil && (res.HeldThrough != st.held || len(res.Disputed) > 0)) {
				t.Fatalf("%s: AppendRecords = %+v, %v; want held %d, nothing disputed, %v", st.name, res, err, st.held, st.err)
			}
		}
		if _, err := r.AppendRecords(ctx, "alloc-nope", 0, recs(1, 1)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown alloc: err = %v, want ErrNotFound", err)
		}
		all, err := r.Records(ctx, "alloc-0000000a", 0, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 170 {
			t.Fatalf("stored %d records, want 170 (each seq once)", len(all))
		}
		for i, rec := range all {
			if rec.Seq != uint64(i+1) || string(rec.Data) != fmt.Sprintf(`{"msg":"line %d"}`, i+1) {
				t.Fatalf("record %d = seq %d %q", i, rec.Seq, rec.Data)
			}
		}
		page, err := r.Records(ctx, "alloc-0000000a", 165, 0, 3)
		if err != nil || len(page) != 3 || page[0].Seq != 166 {
			t.Errorf("Records after 165 limit 3 = %v, %v", page, err)
		}
		a, err := r.Alloc(ctx, "alloc-0000000a")
		if err != nil || a.HeldThrough != 170 {
			t.Errorf("HeldThrough = %d, %v; want 170", a.HeldThrough, err)
		}
	})

	t.Run("a different record at a stored seq is refused and marks the log disputed", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r := runsOf(t, s)
		const id = "alloc-00000d15"
		// A fence as the broker draws them: random, 63 bits.
		const fence = uint64(0x7edcba9876543210)
		if err := r.CreateAlloc(ctx, store.Alloc{ID: id, Name: "n", Region: "us-west-2", State: store.AllocRunning, Fence: fence}); err != nil {
			t.Fatal(err)
		}
		rec := func(seq uint64, kind store.RecordKind, data string) store.RunRecord {
			return store.RunRecord{Seq: seq, Kind: kind, Data: []byte(data)}
		}
		forged := rec(12, store.RecordEvent, `{"msg":"forged"}`)
		steps := []struct {
			name     string
			recs     []store.RunRecord
			held     uint64
			disputed []uint64
			count    uint64 // DisputedRecords after the step
			first    uint64 // FirstDisputedSeq after the step
		}{
			{"genuine first batch", recs(1, 10), 10, nil, 0, 0},
			{"identical re-send is a no-op", recs(1, 10), 10, nil, 0, 0},
			{"a record at a future seq is stored past the gap", []store.RunRecord{forged}, 10, nil, 0, 0},
			{"the genuine batch: its seq 12 is refused, the rest stored", recs(11, 20), 20, []uint64{12}, 1, 12},
			{"the same batch retried counts once", recs(11, 20), 20, []uint64{12}, 1, 12},
			{"a changed record below the mark, in a batch with new ones", append(recs(19, 22), rec(5, store.RecordEvent, `{"msg":"rewritten"}`)), 22, []uint64{5}, 2, 5},
			{"one seq twice in a batch with different content", []store.RunRecord{rec(23, store.RecordEvent, `{"msg":"a"}`), rec(23, store.RecordEvent, `{"msg":"b"}`)}, 23, []uint64{23}, 3, 5},
			{"same data, other kind", []store.RunRecord{{Seq: 1, Kind: store.RecordMetric, Data: recs(1, 1)[0].Data}}, 23, []uint64{1}, 4, 1},
		}
		for _, st := range steps {
			res, err := r.AppendRecords(ctx, id, fence, st.recs)
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			if res.HeldThrough != st.held || !cmp.Equal(res.Disputed, st.disputed, cmpopts.EquateEmpty()) {
				t.Fatalf("%s: AppendRecords = held %d, disputed %v; want held %d, disputed %v", st.name, res.HeldThrough, res.Disputed, st.held, st.disputed)
			}
			a, err := r.Alloc(ctx, id)
			if err != nil || a.DisputedRecords != st.count || a.FirstDisputedSeq != st.first || a.HeldThrough != st.held {
				t.Fatalf("%s: alloc disputed %d from seq %d, held %d, %v; want %d from %d, held %d", st.name, a.DisputedRecords, a.FirstDisputedSeq, a.HeldThrough, err, st.count, st.first, st.held)
			}
		}
		// The first record of each seq stays, whoever sent it.
		got, err := r.Records(ctx, id, 0, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		want := append(append(append(recs(1, 11), forged), recs(13, 22)...), rec(23, store.RecordEvent, `{"msg":"a"}`))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("stored records (-want +got):\n%s", diff)
		}
		// Durable: a state update (which rewrites the body) keeps the
		// mark, and a restarted broker reads it back.
		if _, err := r.UpdateAlloc(ctx, id, func(a *store.Alloc) error {
			a.State, a.LastSeq, a.DisputedRecords = store.AllocSucceeded, 23, 0
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		back, err := runsOf(t, reopen(t)).Alloc(ctx, id)
		if err != nil || back.DisputedRecords != 4 || back.FirstDisputedSeq != 1 || back.Fence != fence {
			t.Fatalf("after an update and a reopen: disputed %d from seq %d, fence %#x, %v; want 4 from 1, fence %#x", back.DisputedRecords, back.FirstDisputedSeq, back.Fence, err, fence)
		}
		if back.HeldThrough != back.LastSeq || back.LogComplete() {
			t.Errorf("held %d of %d with %d disputed: LogComplete = %v, want false (held through the last seq, but disputed)", back.HeldThrough, back.LastSeq, back.DisputedRecords, back.LogComplete())
		}
	})

	t.Run("concurrent conflicting appends keep one record per seq", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r1, r2 := runsOf(t, s), runsOf(t, reopen(t))
		const id, writers, n = "alloc-00000d16", 4, 20
		if err := r1.CreateAlloc(ctx, store.Alloc{ID: id, Name: "n", Region: "us-west-2", State: store.AllocRunning, Fence: 1}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		disputed := make([]int, writers)
		for w := range writers {
			r := r1
			if w%2 == 1 {
				r = r2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				batch := recs(1, n)
				for i := range batch {
					batch[i].Data = fmt.Appendf(nil, `{"msg":"writer %d line %d"}`, w, i+1)
				}
				res, err := r.AppendRecords(ctx, id, 1, batch)
				if err != nil {
					t.Error(err)
					return
				}
				disputed[w] = len(res.Disputed)
			}()
		}
		wg.Wait()
		// Exactly one writer stored its whole batch; every other one had
		// every seq refused (no mix of two writers' records).
		got, err := r1.Records(ctx, id, 0, 0, 100)
		if err != nil || len(got) != n {
			t.Fatalf("stored %d records, %v; want %d", len(got), err, n)
		}
		winner, _, _ := bytes.Cut(got[0].Data, []byte(" line"))
		total := 0
		for i, rec := range got {
			if !bytes.HasPrefix(rec.Data, winner) {
				t.Errorf("seq %d = %s: not from the writer of seq 1 (%s)", i+1, rec.Data, winner)
			}
		}
		for _, d := range disputed {
			total += d
		}
		a, err := r1.Alloc(ctx, id)
		if err != nil || total != (writers-1)*n || a.DisputedRecords != uint64(total) || a.HeldThrough != n {
			t.Errorf("disputed %d in replies, %d on the alloc, held %d, %v; want %d, %d, %d", total, a.DisputedRecords, a.HeldThrough, err, (writers-1)*n, (writers-1)*n, n)
		}
	})

	t.Run("records of kind", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		r := runsOf(t, s)
		if err := r.CreateAlloc(ctx, store.Alloc{ID: "alloc-0000000b", Name: "n", Region: "us-west-2", State: store.AllocRunning, Fence: 1}); err != nil {
			t.Fatal(err)
		}
		in := recs(1, 10)
		for i := range in {
			if i%3 == 0 {
				in[i].Kind = store.RecordMetric
			}
		}
		if _, err := r.AppendRecords(ctx, "alloc-0000000b", 1, in); err != nil {
			t.Fatal(err)
		}
		got, err := r.Records(ctx, "alloc-0000000b", 0, store.RecordMetric, 100)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for _, x := range got {
			seqs = append(seqs, x.Seq)
		}
		if diff := cmp.Diff([]uint64{1, 4, 7, 10}, seqs); diff != "" {
			t.Errorf("metric seqs (-want +got):\n%s", diff)
		}
	})

	t.Run("log records cut checkpoints to their header line", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		r := runsOf(t, s)
		const id = "alloc-0000000f"
		if err := r.CreateAlloc(ctx, store.Alloc{ID: id, Name: "n", Region: "us-west-2", State: store.AllocRunning, Fence: 1}); err != nil {
			t.Fatal(err)
		}
		body := append([]byte{0, 0x0a, 0xff}, bytes.Repeat([]byte{0x80}, 1<<16)...) // binary, newlines in it
		in := []store.RunRecord{
			{Seq: 1, Kind: store.RecordEvent, Data: []byte("{\"msg\":\"a\"}\nsecond line")},
			{Seq: 2, Kind: store.RecordCheckpoint, Data: append([]byte(`{"name":"ckpt.pt","offset":0}`+"\n"), body...)},
			{Seq: 3, Kind: store.RecordMetric, Data: []byte(`{"step":1}`)},
			{Seq: 4, Kind: store.RecordCheckpoint, Data: []byte(`no header line`)},
			{Seq: 5, Kind: store.RecordCheckpoint, Data: []byte("\nbody")},
		}
		if _, err := r.AppendRecords(ctx, id, 1, in); err != nil {
			t.Fatal(err)
		}
		want := []store.RunRecord{in[0], {Seq: 2, Kind: store.RecordCheckpoint, Data: []byte(`{"name":"ckpt.pt","offset":0}`)}, in[2], in[3],
			{Seq: 5, Kind: store.RecordCheckpoint, Data: []byte{}}}
		got, err := r.LogRecords(ctx, id, 0, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("LogRecords (-want +got):\n%s", diff)
		}
		got, err = r.LogRecords(ctx, id, 1, store.RecordCheckpoint, 1)
		if err != nil || len(got) != 1 || string(got[0].Data) != `{"name":"ckpt.pt","offset":0}` {
			t.Errorf("LogRecords of kind checkpoint after 1, limit 1 = %v, %v", got, err)
		}
		full, err := r.Records(ctx, id, 1, store.RecordCheckpoint, 1)
		if err != nil || len(full) != 1 || !bytes.Equal(full[0].Data, in[1].Data) {
			t.Errorf("Records still returns the whole chunk: %d records, %v", len(full), err)
		}
	})

	t.Run("an append racing a re-placement is fenced", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r1, r2 := runsOf(t, s), runsOf(t, reopen(t))
		const id = "alloc-0000000d"
		if err := r1.CreateAlloc(ctx, store.Alloc{ID: id, Name: "n", Region: "us-west-2", State: store.AllocRunning, NodeID: "old", Fence: 1}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		_, err := r1.UpdateAlloc(ctx, id, func(a *store.Alloc) error {
			// The old node appends while the allocation moves (row held
			// by this transaction): it must wait and then see fence 2.
			base := 0
			if o.LockWaiters != nil {
				var err error
				if base, err = o.LockWaiters(ctx, s); err != nil {
					return err
				}
			}
			go func() {
				_, err := r2.AppendRecords(ctx, id, 1, []store.RunRecord{{Seq: 1, Kind: store.RecordEvent, Data: []byte("stale")}})
				done <- err
			}()
			waitBlocked(t, o, s, base, done)
			a.NodeID, a.Fence, a.State = "new", 2, store.AllocMatched
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, store.ErrStaleFence) {
			t.Errorf("append under fence 1 while the run moved to fence 2: err = %v, want ErrStaleFence", err)
		}
		if got, err := r1.Records(ctx, id, 0, 0, 10); err != nil || len(got) != 0 {
			t.Errorf("records after the stale append = %d, %v; want none", len(got), err)
		}
	})

	t.Run("concurrent appends keep the mark", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r1, r2 := runsOf(t, s), runsOf(t, reopen(t))
		const id, n = "alloc-0000000e", 40
		if err := r1.CreateAlloc(ctx, store.Alloc{ID: id, Name: "n", Region: "us-west-2", State: store.AllocRunning, Fence: 1}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := uint64(1); i <= n; i++ {
			r := r1
			if i%2 == 0 {
				r = r2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := r.AppendRecords(ctx, id, 1, recs(i, i)); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		a, err := r1.Alloc(ctx, id)
		if err != nil || a.HeldThrough != n {
			t.Errorf("HeldThrough after %d concurrent appends of seqs 1..%d = %d, %v; want %d", n, n, a.HeldThrough, err, n)
		}
	})

	t.Run("one active allocation per node", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		if _, _, err := s.EnrollAgent(ctx, agent("agt-1", "k1", "us-west-2"), nil); err != nil {
			t.Fatal(err)
		}
		r1, r2 := runsOf(t, s), runsOf(t, reopen(t))
		place := func(r store.Runs, id string) error {
			_, err := r.UpdateAlloc(ctx, id, func(a *store.Alloc) error {
				a.State, a.NodeID, a.Fence = store.AllocMatched, "agt-1", a.Fence+1
				return nil
			})
			return err
		}
		move := func(id string, st store.AllocState) {
			t.Helper()
			if _, err := r1.UpdateAlloc(ctx, id, func(a *store.Alloc) error { a.State = st; return nil }); err != nil {
				t.Fatalf("moving %s to %s: %v", id, st, err)
			}
		}
		for round := 0; round < 10; round++ {
			a, b := fmt.Sprintf("alloc-1%07d", round), fmt.Sprintf("alloc-2%07d", round)
			for _, id := range []string{a, b} {
				if err := r1.CreateAlloc(ctx, store.Alloc{ID: id, Name: "n", Region: "us-west-2", State: store.AllocPending}); err != nil {
					t.Fatal(err)
				}
			}
			// Two brokers place both at once: one wins, the other is told
			// the node is busy.
			errs := make(chan error, 2)
			go func() { errs <- place(r1, a) }()
			go func() { errs <- place(r2, b) }()
			e1, e2 := <-errs, <-errs
			if (e1 == nil) == (e2 == nil) || !errors.Is(errors.Join(e1, e2), store.ErrNodeBusy) {
				t.Fatalf("round %d: two placements on one node: errs %v, %v; want one nil, one ErrNodeBusy", round, e1, e2)
			}
			holder, other := a, b
			if got, _ := r1.Alloc(ctx, a); got.State != store.AllocMatched {
				holder, other = b, a
			}
			if got, err := r1.Alloc(ctx, other); err != nil || got.State != store.AllocPending || got.NodeID != "" {
				t.Fatalf("refused placement was written: %+v, %v", got, err)
			}
			// The holder goes on through its lifecycle; the node stays its.
			move(holder, store.AllocStarting)
			move(holder, store.AllocRunning)
			if err := place(r1, other); !errors.Is(err, store.ErrNodeBusy) {
				t.Fatalf("placing on a node that runs %s: err = %v, want ErrNodeBusy", holder, err)
			}
			move(holder, store.AllocSucceeded)
			if err := place(r2, other); err != nil {
				t.Fatalf("placing on a node whose run ended: %v", err)
			}
			move(other, store.AllocCancelled)
		}
	})

	t.Run("concurrent updates serialise", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		r1, r2 := runsOf(t, s), runsOf(t, reopen(t))
		if err := r1.CreateAlloc(ctx, store.Alloc{ID: "alloc-0000000c", Name: "n", Region: "us-west-2", State: store.AllocRunning}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 20; i++ {
			r := r1
			if i%2 == 1 {
				r = r2 // a second broker on the same database
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := r.UpdateAlloc(ctx, "alloc-0000000c", func(a *store.Alloc) error { a.Fence++; return nil }); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		a, err := r1.Alloc(ctx, "alloc-0000000c")
		if err != nil || a.Fence != 20 {
			t.Errorf("fence after 20 concurrent increments = %d, %v; want 20 (no lost update)", a.Fence, err)
		}
	})
}

// waitBlocked returns once a transaction started after base lock waiters
// were counted is waiting for a lock, or, where the backend cannot say,
// after a short while (the assertions after it hold either way; only
// whether the race was staged depends on it). A call that returned
// already (done) ends the wait too.
func waitBlocked(t *testing.T, o Options, s store.Store, base int, done chan error) {
	t.Helper()
	if o.LockWaiters == nil {
		time.Sleep(100 * time.Millisecond)
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if len(done) > 0 {
			return
		}
		n, err := o.LockWaiters(context.Background(), s)
		if err != nil {
			t.Errorf("counting lock waiters: %v", err)
			return
		}
		if n > base {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Errorf("no transaction blocked on a lock within 10s")
}
