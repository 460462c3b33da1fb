package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/store"
)

// runLeases checks store.Leases as two replicas (two handles) see it:
// one holder at a time, renewals keep the fence, an expired or released
// lease passes to the other with a higher fence, and of replicas racing
// for a free lease exactly one gets it.
func runLeases(t *testing.T, open Factory) {
	t.Run("leases", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s, reopen := open(t)
		a, ok := s.(store.Leases)
		if !ok {
			t.Fatalf("%T does not implement store.Leases", s)
		}
		b := reopen(t).(store.Leases)
		const ttl = 10 * time.Second
		type step struct {
			what    string
			l       store.Leases
			holder  string
			at      time.Duration // after t0
			release bool
			held    bool
			fence   uint64
		}
		for _, st := range []step{
			{what: "a takes the free lease", l: a, holder: "a", held: true, fence: 1},
			{what: "b while a holds it", l: b, holder: "b", at: 5 * time.Second},
			{what: "a renews", l: a, holder: "a", at: 9 * time.Second, held: true, fence: 1},
			{what: "b before the renewal ends", l: b, holder: "b", at: 18 * time.Second},
			{what: "b once a's renewal expired", l: b, holder: "b", at: 19 * time.Second, held: true, fence: 2},
			{what: "a back from a pause", l: a, holder: "a", at: 20 * time.Second},
			{what: "a releases what it does not hold", l: a, holder: "a", at: 20 * time.Second, release: true},
			{what: "a after its no-op release", l: a, holder: "a", at: 21 * time.Second},
			{what: "b releases", l: b, holder: "b", at: 22 * time.Second, release: true},
			{what: "a at once after b's release", l: a, holder: "a", at: 22 * time.Second, held: true, fence: 3},
		} {
			if st.release {
				if err := st.l.ReleaseLease(ctx, "once", st.holder); err != nil {
					t.Fatalf("%s: %v", st.what, err)
				}
				continue
			}
			held, fence, err := st.l.AcquireLease(ctx, "once", st.holder, t0.Add(st.at), ttl)
			if err != nil {
				t.Fatalf("%s: %v", st.what, err)
			}
			if held != st.held || (held && fence != st.fence) {
				t.Errorf("%s: held %v fence %d, want held %v fence %d", st.what, held, fence, st.held, st.fence)
			}
		}
		if held, _, err := b.AcquireLease(ctx, "other", "b", t0, ttl); err != nil || !held {
			t.Errorf("a second lease name: held %v, %v; want held (leases are independent)", held, err)
		}

		const n = 8
		var wg sync.WaitGroup
		var mu sync.Mutex
		winners := 0
		for i := range n {
			l := a
			if i%2 == 1 {
				l = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				held, _, err := l.AcquireLease(ctx, "race", string(rune('a'+i)), t0, ttl)
				if err != nil {
					t.Error(err)
					return
				}
				if held {
					mu.Lock()
					winners++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if winners != 1 {
			t.Errorf("%d of %d replicas racing for a free lease got it, want exactly 1", winners, n)
		}
	})
}
