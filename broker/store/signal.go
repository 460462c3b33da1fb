package store

import "context"

// Signals carry wake-ups between the broker replicas sharing one store
// (PostgreSQL LISTEN/NOTIFY): a log follower or an agent's work poll
// waiting on one replica hears of another replica's write at once rather
// than at its next periodic re-read of the store. They are best effort:
// a signal lost with a connection only delays the waiter to that re-read,
// which stays. Nothing in a signal is trusted beyond "look again".
type Signals interface {
	// Signal sends payload (at most MaxSignal bytes) to every listener,
	// this replica's own included.
	Signal(ctx context.Context, payload string) error
	// Listen calls listening once it listens, then fn with each payload
	// signalled, until ctx ends or its connection fails (an error: the
	// caller listens again). A store that cannot carry signals returns
	// errors.ErrUnsupported at once.
	Listen(ctx context.Context, listening func(), fn func(payload string)) error
}

// MaxSignal is the longest payload Signal takes: PostgreSQL's NOTIFY
// takes less than 8,000 bytes.
const MaxSignal = 7999
