package store

import "context"

// LogUsage tells the broker how much of a run's log a store holds, for
// the per-run quota (broker/quota.go). It is read from the records
// themselves, so every replica on one PostgreSQL sees the same figure;
// the window arguments let a caller add up a long log piece by piece
// instead of summing it again on every upload. The SQL backends
// implement it (a separate interface: a store without it has no byte
// quota).
type LogUsage interface {
	// LogBytes returns the bytes of event and metric records (checkpoint
	// chunks are bounded apart) stored for allocID with seq > after:
	// above counts all of them, within only those with seq <= through.
	LogBytes(ctx context.Context, allocID string, after, through uint64) (above, within int64, err error)
}
