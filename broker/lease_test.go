package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Of three brokers on one PostgreSQL exactly one does the once-only work,
// and when it stops another takes over; on SQLite (one broker) the
// broker leads without a lease.
func TestOnceOnlyLease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaders := func(bs []*brokertest.Broker) []int {
		var l []int
		for i, b := range bs {
			if b != nil && b.Broker.Leading() {
				l = append(l, i)
			}
		}
		return l
	}
	cfg := brokertest.Fast()
	cfg.LeaseTTL = time.Second
	db := brokertest.NewDB(t, "postgres")
	var bs []*brokertest.Broker
	for range 3 {
		bs = append(bs, brokertest.Start(t, db, cfg))
	}
	upstack.WaitFor(t, ctx, "one of three replicas leading", func() bool { return len(leaders(bs)) == 1 })
	// It stays one while renewals go on.
	for range 5 {
		time.Sleep(cfg.LeaseTTL / 3)
		if l := leaders(bs); len(l) != 1 {
			t.Fatalf("replicas %v lead at once, want exactly one", l)
		}
	}
	first := leaders(bs)[0]
	bs[first].Stop(t)
	bs[first] = nil
	upstack.WaitFor(t, ctx, "a survivor leading", func() bool { return len(leaders(bs)) == 1 })

	lite := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), broker.Config{})
	if !lite.Broker.Leading() {
		t.Error("a broker on SQLite does not do the once-only work")
	}
}
