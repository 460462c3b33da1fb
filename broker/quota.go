package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
)

// Per-run quota. A job is untrusted and an agent may be broken: every
// run's records are bounded in number (by seq, which needs no state), in
// bytes of log (event and metric records, read from the store so every
// replica on one PostgreSQL agrees) and in rate (per replica, in memory:
// back-pressure, not loss). The agent bounds its runs' output below these
// at the source (gpupass-agent --run-log-*); these are the backstop.

// Default per-run limits (Config; gpupass-broker serve --run-max-*).
const (
	DefaultRunMaxRecords          = 10_000_000
	DefaultRunMaxLogBytes         = 512 << 20
	DefaultRunMaxRecordsPerSecond = 5000
)

// quotaState is this replica's accounting of runs' logs.
type quotaState struct {
	mu   sync.Mutex
	runs map[string]*runUsage
}

// runUsage: bytes is the log size through seq held (records under the
// gap-free mark never change, so it is added to, never read again);
// tokens is the rate bucket.
type runUsage struct {
	held   uint64
	bytes  int64
	tokens float64
	at     time.Time
}

// quotaIdle: entries of runs that sent nothing this long are dropped (at
// most a re-read of their log on the next upload).
const quotaIdle = 10 * time.Minute

// admitRecords checks an upload against the run's quota before it is
// stored. A run over its records or bytes quota is failed with the
// reason (the node's next update stops it); a run over its rate gets
// CodeUnavailable and its agent retries later.
func (b *Broker) admitRecords(ctx context.Context, rs store.Runs, a store.Alloc, recs []store.RunRecord) error {
	c := b.cfg
	var batch int64
	for _, r := range recs {
		if c.RunMaxRecords > 0 && r.Seq > uint64(c.RunMaxRecords) {
			return b.overQuota(ctx, rs, a, fmt.Sprintf("run %s reached its limit of %d records (gpupass-broker --run-max-records): records from seq %d refused", a.ID, c.RunMaxRecords, r.Seq))
		}
		if r.Kind != store.RecordCheckpoint && r.Seq > a.HeldThrough {
			batch += int64(len(r.Data))
		}
	}
	now := time.Now()
	q := &b.quota
	q.mu.Lock()
	if q.runs == nil {
		q.runs = map[string]*runUsage{}
	}
	u := q.runs[a.ID]
	if u == nil {
		if len(q.runs) >= 4096 {
			for id, x := range q.runs {
				if now.Sub(x.at) > quotaIdle {
					delete(q.runs, id)
				}
			}
		}
		u = &runUsage{tokens: float64(c.RunMaxRecordsPerSecond), at: now}
		q.runs[a.ID] = u
	}
	if c.RunMaxRecordsPerSecond > 0 {
		// A bucket of one second's worth that a batch may overdraw: the
		// next batch waits until it is refilled.
		rate := float64(c.RunMaxRecordsPerSecond)
		u.tokens = min(rate, u.tokens+now.Sub(u.at).Seconds()*rate)
		if u.tokens <= 0 {
			u.at = now
			q.mu.Unlock()
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("run %s sends more than %d records/s (gpupass-broker --run-max-records-per-second): retry later", a.ID, c.RunMaxRecordsPerSecond))
		}
		u.tokens -= float64(len(recs))
	}
	u.at = now
	after := u.held
	q.mu.Unlock()

	lu, ok := b.store.(store.LogUsage)
	if c.RunMaxLogBytes <= 0 || !ok || batch == 0 {
		return nil
	}
	above, within, err := lu.LogBytes(ctx, a.ID, after, a.HeldThrough)
	if err != nil {
		return b.storeErr("log size of "+a.ID, err)
	}
	q.mu.Lock()
	used := u.bytes + above
	if u.held == after && a.HeldThrough > after {
		u.bytes, u.held = u.bytes+within, a.HeldThrough
	}
	q.mu.Unlock()
	if used+batch > c.RunMaxLogBytes {
		return b.overQuota(ctx, rs, a, fmt.Sprintf("run %s reached its log limit of %s (gpupass-broker --run-max-log-mb): %d bytes stored, %d more refused", a.ID, mb(c.RunMaxLogBytes), used, batch))
	}
	return nil
}

// overQuota fails the run with why as its reason, so the user sees it
// in `gpupass runs` and the node stops it (its next update is refused),
// and refuses the upload.
func (b *Broker) overQuota(ctx context.Context, rs store.Runs, seen store.Alloc, why string) error {
	_, err := rs.UpdateAlloc(ctx, seen.ID, func(a *store.Alloc) error {
		if a.Fence != seen.Fence || a.State.Terminal() {
			return errMoved
		}
		a.State, a.Reason, a.FinishedAt = store.AllocFailed, "quota: "+why, time.Now().UTC()
		return nil
	})
	switch {
	case err == nil:
		b.log.Warn("run over quota: failed", "alloc", seen.ID, "node", seen.NodeID, "reason", why)
		b.runs.wakeRun(seen.ID)
	case !errors.Is(err, errMoved):
		b.log.Error("failing a run over quota", "alloc", seen.ID, "err", err)
	}
	b.metrics.Refused("quota")
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s: stop the run", why))
}

func mb(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Store health. Liveness never depends on the store being writable:
// beats are kept in memory (Broker.seen) and count from there; a flush
// that fails leaves them dirty and is tried again every FlushInterval.
// What a failed write says is kept here, for /healthz, the log and the
// errors clients get, until a write succeeds again.
type storeHealth struct {
	mu    sync.Mutex
	err   error
	since time.Time
}

// noteStoreWrite records the outcome of a store write: err nil clears
// the state, an error sets it (logged once per change). It returns
// whether err is news: a store that stays full is said once, not at
// every flush.
func (b *Broker) noteStoreWrite(err error) (news bool) {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	news = (err == nil) != (h.err == nil)
	switch {
	case err == nil && h.err != nil:
		b.log.Info("store writable again", "after", time.Since(h.since).Round(time.Millisecond))
		h.err = nil
	case err != nil && h.err == nil:
		h.err, h.since = err, time.Now()
		b.log.Error("store not writable: keeping heartbeats in memory until it is", "reason", storeReason(err))
	case err != nil:
		h.err = err
	}
	return news
}

// storeUnwritable returns why the store is not writable ("" when it is).
func (b *Broker) storeUnwritable() string {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		return ""
	}
	return storeReason(h.err)
}

// storeFull reports whether err says the store's disk is full: ENOSPC,
// SQLite's SQLITE_FULL, PostgreSQL's disk_full (53100).
func storeFull(err error) bool {
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	s := err.Error()
	for _, m := range []string{"database or disk is full", "no space left on device", "SQLSTATE 53100", "(SQLITE_FULL)"} {
		if strings.Contains(strings.ToLower(s), strings.ToLower(m)) {
			return true
		}
	}
	return false
}

func storeReason(err error) string {
	if storeFull(err) {
		return "broker store full: " + err.Error()
	}
	return err.Error()
}
