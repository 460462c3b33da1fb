package store

import (
	"context"
	"time"
)

// Leases let several broker replicas on one store agree on which of them
// does a piece of work that must happen once (offline detection, start
// timeouts, run supervision): a named row with its holder, an expiry and
// a fencing counter. A lease is a row rather than a PostgreSQL advisory
// lock because an advisory lock belongs to one database session (a pooled
// connection must be pinned for it, and a replica that hangs with its
// connection open keeps it for ever), has no fencing counter and does not
// exist in SQLite; a row lease expires by itself and works on both.
//
// Expiry is judged by the callers' clocks: replicas' clocks must agree to
// well within the TTL (NTP does).
type Leases interface {
	// AcquireLease takes the lease name for holder until now+ttl when it
	// is free, expired or already holder's (a renewal), in one
	// statement. held says whether holder has it now; fence rises by one
	// each time the lease passes to another holder, never on a renewal.
	AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (held bool, fence uint64, err error)
	// ReleaseLease lets the lease go at once if holder has it (a clean
	// shutdown), so another replica need not wait for it to expire.
	ReleaseLease(ctx context.Context, name, holder string) error
	// Shared reports whether several brokers may use the store at once
	// (PostgreSQL). A broker on a store that is not shared (a SQLite
	// file: one broker) does once-only work without a lease, so that a
	// restart after a crash does not wait for its old lease to expire.
	Shared() bool
}
