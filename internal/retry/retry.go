// Package retry is the project's one retry delay, drawn by
// github.com/cenkalti/backoff/v5 (as woodpecker's agent does): capped
// exponential back-off with jitter, so that clients cut off by the same
// broker or forge outage do not all come back at the same instant. Every
// loop that waits before trying again (the agent's enroll, state edges,
// run reports and log uploads, the client's fail-over, the forge client,
// the broker's replica signals) takes its delays from Backoff. Registry
// calls keep go-containerregistry's own retry (see internal/bundle).
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Jitter is the spread of each delay around the library's interval:
// ±50% keeps two clients that failed at once apart from the first retry.
const Jitter = 0.5

// Backoff returns the delays before successive retries of one loop: the
// first in [lo, 3×lo], each interval about twice the last, every delay
// within [lo, hi] (the cap each loop had before; lo keeps a loop from
// spinning). Reset starts over after a success. Not safe for concurrent
// use: one per loop.
func Backoff(lo, hi time.Duration) backoff.BackOff {
	if lo <= 0 {
		lo = time.Millisecond
	}
	hi = max(lo, hi)
	// The library caps the interval, not the jittered delay: an interval
	// of hi/(1+Jitter) keeps the delay under hi, one of lo/(1-Jitter)
	// keeps it over lo.
	b := &backoff.ExponentialBackOff{
		InitialInterval:     time.Duration(float64(lo) / (1 - Jitter)),
		RandomizationFactor: Jitter,
		Multiplier:          2,
		MaxInterval:         time.Duration(float64(hi) / (1 + Jitter)),
	}
	b.Reset()
	return &bounded{b: b, lo: lo, hi: hi}
}

// bounded holds the delays to [lo, hi] where hi < 3×lo leaves the
// library's interval no room between the two.
type bounded struct {
	b      *backoff.ExponentialBackOff
	lo, hi time.Duration
}

func (c *bounded) NextBackOff() time.Duration {
	return min(max(c.b.NextBackOff(), c.lo), c.hi)
}

func (c *bounded) Reset() { c.b.Reset() }
