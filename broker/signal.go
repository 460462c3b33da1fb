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
)

// relay passes this replica's wake-ups (a run changed: log followers look
// again; work for a node: its agent's long poll looks again) to the other
// replicas on the same store, and theirs to it, through store.Signals
// (PostgreSQL NOTIFY). Without it a follower on one replica heard of
// records another replica stored only at its once-a-second re-read, and
// a run placed by one replica reached an agent polling another at the
// poll's own re-read.
//
// Wake-ups are coalesced: at most one signal per relayEvery per replica,
// naming the nodes woken since the last one (every node, "*", when they
// do not fit one payload). A signal only says "look again": waiters still
// re-read the store for what changed, and still re-read it periodically,
// so a lost signal (a dropped connection) costs latency, never records.
// After listening again, a replica wakes all its waiters once, for what
// it may have missed.
//
// Payload: "gp1 FROM c|- NODE…" (FROM: the sender's tag, so that a
// replica ignores its own signals, which it has already acted on).
type relay struct {
	st  store.Signals
	tag string

	mu      sync.Mutex
	changes bool
	nodes   map[string]struct{}
	size    int  // bytes the node ids take in a payload
	all     bool // more nodes than one payload holds
	kick    chan struct{}
}

// relayEvery bounds the signals a replica sends: one per 10 ms at most.
const relayEvery = 10 * time.Millisecond

func newRelay(st store.Signals) *relay {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &relay{st: st, tag: hex.EncodeToString(b[:]), nodes: map[string]struct{}{}, kick: make(chan struct{}, 1)}
}

// changed queues "a run changed" for the other replicas. No-op on nil.
func (r *relay) changed() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.changes = true
	r.mu.Unlock()
	r.poke()
}

// node queues "work for node id" for the other replicas. No-op on nil.
func (r *relay) node(id string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if _, ok := r.nodes[id]; !ok && !r.all {
		if r.size+1+len(id) > store.MaxSignal-64 || strings.ContainsAny(id, " \n") {
			r.all = true
		} else {
			r.nodes[id] = struct{}{}
			r.size += 1 + len(id)
		}
	}
	r.mu.Unlock()
	r.poke()
}

func (r *relay) poke() {
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
	if !r.changes && len(r.nodes) == 0 && !r.all {
		return ""
	}
	var sb strings.Builder
	sb.Grow(32 + r.size)
	sb.WriteString("gp1 ")
	sb.WriteString(r.tag)
	if r.changes {
		sb.WriteString(" c")
	} else {
		sb.WriteString(" -")
	}
	if r.all {
		sb.WriteString(" *")
	} else {
		for id := range r.nodes {
			sb.WriteByte(' ')
			sb.WriteString(id)
		}
	}
	r.changes, r.all, r.size = false, false, 0
	clear(r.nodes)
	return sb.String()
}

// parseSignal reads a payload: whether runs changed, the nodes to wake
// and whether every node is to be woken. ok is false for a payload that
// is not a relay signal or that this replica sent itself.
func (r *relay) parseSignal(p string) (changes bool, nodes []string, all, ok bool) {
	f := strings.Fields(p)
	if len(f) < 3 || f[0] != "gp1" || f[1] == r.tag {
		return false, nil, false, false
	}
	changes = f[2] == "c"
	for _, id := range f[3:] {
		if id == "*" {
			all = true
			continue
		}
		nodes = append(nodes, id)
	}
	return changes, nodes, all, true
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
			if err := r.st.Signal(ctx, p); err != nil && time.Since(lastErr) > 10*time.Second {
				// Waiters on other replicas fall back to their re-reads.
				lastErr = time.Now()
				b.log.Warn("signalling the other replicas failed; they will see this replica's changes at their next re-read", "err", err)
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
	wait := time.Second
	for {
		heard := false
		err := r.st.Listen(ctx, func() {
			// What was signalled while not listening is lost: everyone
			// waiting here looks again once.
			b.runs.notifyHere()
			b.runs.wakeAllNodesHere()
		}, func(p string) {
			heard = true
			changes, nodes, all, ok := r.parseSignal(p)
			if !ok {
				return
			}
			if changes {
				b.runs.notifyHere()
			}
			if all {
				b.runs.wakeAllNodesHere()
			}
			for _, id := range nodes {
				b.runs.wakeNodeHere(id)
			}
		})
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errors.ErrUnsupported) {
			return
		}
		if heard {
			wait = time.Second
		}
		b.log.Warn("listening for the other replicas' signals failed; listening again (meanwhile waiters re-read the store periodically)", "err", err, "retry_in", wait)
		select {
		case <-b.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}
