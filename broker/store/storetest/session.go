package storetest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/gpupass/gpupass/broker/store"
)

// runSessionKeys checks store.SessionKeys: epochs rise by one per
// rotation, the newest verifier wins, a second handle (another replica) reads
// what the first wrote, and concurrent rotations hand out distinct epochs.
func runSessionKeys(t *testing.T, open Factory) {
	t.Run("session keys", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s, reopen := open(t)
		sk, ok := s.(store.SessionKeys)
		if !ok {
			t.Fatalf("%T does not implement store.SessionKeys", s)
		}
		if _, _, err := sk.SessionVerifier(ctx, "agt-none"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("SessionVerifier of an agent with none: err = %v, want ErrNotFound", err)
		}
		k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
		for i, k := range [][]byte{k1, k2} {
			e, err := sk.RotateSessionKey(ctx, "agt-a", k, t0)
			if err != nil {
				t.Fatal(err)
			}
			if want := uint64(i + 1); e != want {
				t.Errorf("rotation %d: epoch %d, want %d", i+1, e, want)
			}
		}
		if _, err := sk.RotateSessionKey(ctx, "agt-b", k1, t0); err != nil {
			t.Fatal(err)
		}
		other := reopen(t).(store.SessionKeys)
		key, e, err := other.SessionVerifier(ctx, "agt-a")
		if err != nil || e != 2 || !bytes.Equal(key, k2) {
			t.Errorf("SessionVerifier(agt-a) from a second handle = epoch %d, verifier equal to the newest %v, err %v; want epoch 2, true, nil", e, bytes.Equal(key, k2), err)
		}
		if key, e, err := sk.SessionVerifier(ctx, "agt-b"); err != nil || e != 1 || !bytes.Equal(key, k1) {
			t.Errorf("SessionVerifier(agt-b) = epoch %d, verifier equal %v, err %v; want epoch 1, true, nil", e, bytes.Equal(key, k1), err)
		}

		const n = 8
		var wg sync.WaitGroup
		epochs := make(chan uint64, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e, err := sk.RotateSessionKey(ctx, "agt-c", k1, t0)
				if err != nil {
					t.Error(err)
					return
				}
				epochs <- e
			}()
		}
		wg.Wait()
		close(epochs)
		seen := map[uint64]bool{}
		for e := range epochs {
			if seen[e] {
				t.Errorf("concurrent rotations handed out epoch %d twice", e)
			}
			seen[e] = true
		}
		if _, e, err := sk.SessionVerifier(ctx, "agt-c"); err != nil || e != n {
			t.Errorf("after %d rotations: epoch %d, err %v; want %d", n, e, err, n)
		}
	})
}
