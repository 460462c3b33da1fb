package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/retry"
)

// relay passes this replica's wake-ups (a run changed: its log followers
// look again; work for a node: its agent's long poll looks again) to the
// other replicas on the same store, and theirs to it, through
// store.Signals (PostgreSQL NOTIFY). Without it a follower on one replica
// heard of records another replica stored only at its once-a-second
// re-read, and a run placed by one replica reached an agent polling
// another at the poll's own re-read.
//
// Wake-ups are coalesced: at most one signal per relayEvery per replica,
// naming the keys (runKey, nodeKey) woken since the last one, or "*"
// (everyone) when they do not fit one payload. A signal only says "look
// again": waiters still re-read the store for what changed, and still
// re-read it periodically, so a lost signal (a dropped connection) costs
// latency, never records. After listening again, a replica wakes all its
// waiters once, for what it may have missed.
//
// Payload: "gp1 FROM KEY…" (FROM: the sender's tag, so that a replica
// ignores its own signals, which it has already acted on).
type relay struct {
	st  store.Signals
	tag string

	mu   sync.Mutex
	keys map[string]struct{}
	size int  // bytes the keys take in a payload
	all  bool // more keys than one payload holds
	kick chan struct{}
}

// relayEvery bounds the signals a replica sends: one per 10 ms at most.
const relayEvery = 10 * time.Millisecond

func newRelay(st store.Signals) *relay {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &relay{st: st, tag: hex.EncodeToString(b[:]), keys: map[string]struct{}{}, kick: make(chan struct{}, 1)}
}

// add queues a wake-up of key for the other replicas. No-op on nil.
func (r *relay) add(key string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if _, ok := r.keys[key]; !ok && !r.all {
		if r.size+1+len(key) > store.MaxSignal-64 || strings.ContainsAny(key, " \t\n") {
			r.all = true
		} else {
			r.keys[key] = struct{}{}
			r.size += 1 + len(key)
		}
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// take returns the payload of what is queued ("" for nothing) and
// empties the queue.
func (r *relay) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keys) == 0 && !r.all {
		return ""
	}
	var sb strings.Builder
	sb.Grow(32 + r.size)
	sb.WriteString("gp1 ")
	sb.WriteString(r.tag)
	if r.all {
		sb.WriteString(" *")
	} else {
		for key := range r.keys {
			sb.WriteByte(' ')
			sb.WriteString(key)
		}
	}
	r.all, r.size = false, 0
	clear(r.keys)
	return sb.String()
}

// parseSignal reads a payload: the keys to wake, or all. ok is false for
// a payload that is not a relay signal or that this replica sent itself.
// Keys other than a run's or a node's are skipped.
func (r *relay) parseSignal(p string) (keys []string, all, ok bool) {
	f := strings.Fields(p)
	if len(f) < 2 || f[0] != "gp1" || f[1] == r.tag {
		return nil, false, false
	}
	for _, k := range f[2:] {
		switch {
		case k == "*":
			all = true
		case strings.HasPrefix(k, "r:") || strings.HasPrefix(k, "n:"):
			keys = append(keys, k)
		}
	}
	return keys, all, true
}

// sendSignals sends the queued wake-ups until the broker stops.
func (b *Broker) sendSignals(r *relay) {
	defer b.wg.Done()
	var lastErr time.Time
	for {
		select {
		case <-b.stop:
			return
		case <-r.kick:
		}
		if p := r.take(); p != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			switch err := r.st.Signal(ctx, p); {
			case err == nil:
				b.metrics.SignalSent()
			default:
				b.metrics.SignalError("send")
				if time.Since(lastErr) > 10*time.Second {
					// Waiters on other replicas fall back to their re-reads.
					lastErr = time.Now()
					b.log.Warn("signalling the other replicas failed; they will see this replica's changes at their next re-read", "err", err)
				}
			}
			cancel()
		}
		select {
		case <-b.stop:
			return
		case <-time.After(relayEvery):
		}
	}
}

// listenSignals listens for the other replicas' wake-ups until the
// broker stops, listening again after a failure.
func (b *Broker) listenSignals(r *relay) {
	defer b.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	bo := retry.Backoff(time.Second, 30*time.Second)
	for {
		listened := false
		err := r.st.Listen(ctx, func() {
			// What was signalled while not listening is lost: everyone
			// waiting here looks again once.
			listened = true
			b.metrics.SignalListening(true)
			b.runs.wakeAllHere()
		}, func(p string) {
			keys, all, ok := r.parseSignal(p)
			if !ok {
				return
			}
			b.metrics.SignalReceived()
			if all {
				b.runs.wakeAllHere()
				return
			}
			for _, k := range keys {
				b.runs.wakeHere(k)
			}
		})
		b.metrics.SignalListening(false)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errors.ErrUnsupported) {
			return
		}
		b.metrics.SignalError("listen")
		if listened {
			bo.Reset() // it worked for a while: not a failing server
		}
		// Jittered: replicas cut off by the same PostgreSQL restart do
		// not all listen again at the same instant.
		wait := bo.NextBackOff()
		b.log.Warn("listening for the other replicas' signals failed; listening again (meanwhile waiters re-read the store periodically)", "err", err, "retry_in", wait)
		select {
		case <-b.stop:
			return
		case <-time.After(wait):
		}
	}
}
