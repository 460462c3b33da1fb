// Package backoff is the one retry delay of the agent's loops (enroll,
// state edges, run reports, log uploads): capped exponential back-off with
// decorrelated jitter, so that agents cut off by the same broker restart
// do not all come back at the same instant.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff gives the delays before successive retries. Each is drawn
// uniformly from [Min, 3×previous], capped at Max ("decorrelated jitter",
// AWS Architecture Blog, "Exponential Backoff and Jitter"): never below
// Min, so a loop cannot spin; never above Max, the cap each loop had
// before; growing about as fast as doubling. The zero value is not
// usable: set Min and Max (New). Not safe for concurrent use: one per
// loop.
type Backoff struct {
	Min, Max time.Duration
	// Int64N draws from [0, n); nil means math/rand/v2 (seeded per
	// process, so two agents never share a schedule). Tests may set it.
	Int64N func(n int64) int64

	prev time.Duration
}

// New returns a Backoff between min and max.
func New(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max} }

// Next returns the delay before the next retry.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = time.Millisecond
	}
	if hi < lo {
		hi = lo
	}
	prev := max(b.prev, lo)
	top := hi
	if prev <= hi/3 {
		top = 3 * prev
	}
	draw := b.Int64N
	if draw == nil {
		draw = rand.Int64N
	}
	b.prev = lo + time.Duration(draw(int64(top-lo)+1))
	return b.prev
}

// Reset starts again from Min, after a success.
func (b *Backoff) Reset() { b.prev = 0 }
