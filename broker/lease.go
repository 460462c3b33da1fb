package broker

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"os"
	"sync"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
)

// Several broker replicas may share one store (PostgreSQL). Work that
// must happen once — run supervision (placing pending runs, start
// timeouts, runs whose node went offline) and reporting nodes going
// offline — is done only by the replica holding the "once" lease
// (store.Leases). Each replica tries to take or renew it every
// LeaseTTL/3; when its holder dies, the lease expires and another
// replica takes it within LeaseTTL plus one renewal interval. The lease
// is an efficiency and a promise of one voice, not the only guard: run
// changes are compare-and-swap on the run's state and fence, so a
// replica acting on a lease it has just lost (a pause longer than the
// TTL) changes nothing another replica changed first.

// onceLease names the lease of once-only work.
const onceLease = "broker-once"

// DefaultLeaseTTL is Config.LeaseTTL's default.
const DefaultLeaseTTL = 15 * time.Second

type leaseState struct {
	mu    sync.Mutex
	until time.Time // this replica holds the lease until then (its clock)
	fence uint64
}

// newEchoTag picks the low bits of this replica's broker times
// (api.EchoReplicaMask): never 0, so that an untagged time is foreign.
func newEchoTag() int64 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return int64(binary.LittleEndian.Uint32(b[:]))%api.EchoReplicaMask + 1
}

// brokerTime is this replica's clock as it gives it to agents, tagged
// with its echoTag: less than one tag span (65 µs) behind the clock,
// never ahead of it (an echo from the future is refused).
func (b *Broker) brokerTime() int64 {
	now := time.Now().UnixNano()
	t := now&^api.EchoReplicaMask | b.echoTag
	if t > now {
		t -= api.EchoReplicaMask + 1
	}
	return t
}

// newReplicaID names this broker process among replicas (lease holder).
func newReplicaID() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// leases returns the store's leases when replicas may share it.
func (b *Broker) leases() (store.Leases, bool) {
	ls, ok := b.store.(store.Leases)
	return ls, ok && ls.Shared()
}

// leading reports whether this replica does once-only work now. A store
// that is not shared has one broker.
func (b *Broker) leading() bool {
	if _, ok := b.leases(); !ok {
		return true
	}
	b.once.mu.Lock()
	defer b.once.mu.Unlock()
	return time.Now().Before(b.once.until)
}

// renewLease takes or renews the once lease. The replica counts itself
// the holder until a fifth of the TTL before the expiry written in the
// store, so that it stops before another can start (clocks agreeing).
func (b *Broker) renewLease(ctx context.Context) error {
	ls, ok := b.leases()
	if !ok {
		return nil
	}
	start := time.Now()
	held, fence, err := ls.AcquireLease(ctx, onceLease, b.replicaID, start, b.cfg.LeaseTTL)
	if err != nil {
		return err // what it holds runs out by itself
	}
	b.once.mu.Lock()
	was := start.Before(b.once.until)
	if held {
		b.once.until, b.once.fence = start.Add(b.cfg.LeaseTTL-b.cfg.LeaseTTL/5), fence
	} else {
		b.once.until = time.Time{}
	}
	b.once.mu.Unlock()
	switch {
	case held && !was:
		b.log.Info("this replica took the lease of once-only work (run supervision, offline detection)", "replica", b.replicaID, "fence", fence)
	case !held && was:
		b.log.Warn("this replica lost the lease of once-only work to another", "replica", b.replicaID)
	}
	return nil
}

// releaseLease hands the lease back on a clean shutdown, so that another
// replica takes it at its next renewal instead of after the TTL.
func (b *Broker) releaseLease(ctx context.Context) {
	ls, ok := b.leases()
	if !ok {
		return
	}
	b.once.mu.Lock()
	held := time.Now().Before(b.once.until)
	b.once.until = time.Time{}
	b.once.mu.Unlock()
	if !held {
		return
	}
	if err := ls.ReleaseLease(ctx, onceLease, b.replicaID); err != nil {
		b.log.Warn("releasing the lease of once-only work", "err", err)
	}
}

// onceOnly wraps a background loop's work so that only the lease holder
// does it.
func (b *Broker) onceOnly(fn func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if !b.leading() {
			return nil
		}
		return fn(ctx)
	}
}

// Leading reports whether this broker does the once-only work now: it
// holds the lease, or its store is not shared by replicas.
func (b *Broker) Leading() bool { return b.leading() }
