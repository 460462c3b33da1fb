// Package uploader ships a run's spooled records (events and metric
// points) to the control plane and acknowledges them in the spool once
// the control plane holds them, so a broker restart or a network
// partition loses nothing and, as the broker stores by (run, seq),
// duplicates nothing.
//
// The transport is a Sink; the agent's broker client implements it over
// internal/api. This package never imports the broker.
package uploader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/retry"
)

// Sink is where records go.
type Sink interface {
	// Upload sends records of one run, in seq order without gaps,
	// starting right after what the sink acknowledged before. It
	// returns the highest seq the sink now durably holds for the run
	// with every lower seq also held (a sink that already had some of
	// them, after a lost reply, answers the same). An error means
	// nothing is known to be held; the uploader retries with backoff.
	Upload(ctx context.Context, allocID string, recs []spool.Record) (heldThrough uint64, err error)
}

// ErrRefused is what a Sink wraps when the other side refuses the run's
// records for good (the run was moved to another node, or is unknown
// there): retrying cannot help, so the uploader stops with it instead of
// retrying until its context ends.
var ErrRefused = errors.New("the control plane refuses this run's records")

// Uploader drains one run's spool into a Sink.
type Uploader struct {
	AllocID string
	Spool   *spool.Spool
	Sink    Sink
	// Batch is the most records per Upload (default 2048; the spool
	// also caps a batch at a few MiB).
	Batch int
	// Poll is how often an empty spool is looked at again (default
	// 100ms); Kick wakes the uploader sooner.
	Poll time.Duration
	// MinBackoff and MaxBackoff bound the retry delay after a failed
	// upload (defaults 100ms and 10s; internal/retry: jittered, about
	// doubling per failure).
	MinBackoff, MaxBackoff time.Duration
	Log                    *slog.Logger

	once sync.Once
	kick chan struct{}
	// held is the highest seq the sink acknowledged, which the spool's
	// ACK file may lag (it cannot be written on a full disk).
	held uint64
}

// Kick tells the uploader new records are there. It never blocks.
func (u *Uploader) Kick() {
	u.init()
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

func (u *Uploader) init() {
	u.once.Do(func() { u.kick = make(chan struct{}, 1) })
}

// Run uploads until ctx ends. It returns ctx's error, or an error that
// retrying cannot fix (a corrupt spool, a sink acknowledging what was
// never sent).
func (u *Uploader) Run(ctx context.Context) error {
	return u.loop(ctx, false)
}

// Drain uploads until the spool holds nothing unacknowledged (at the end
// of a run), retrying failures until ctx ends.
func (u *Uploader) Drain(ctx context.Context) error {
	return u.loop(ctx, true)
}

func (u *Uploader) loop(ctx context.Context, untilEmpty bool) error {
	u.init()
	batch := u.Batch
	if batch <= 0 {
		batch = 2048
	}
	poll := u.Poll
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	minB, maxB := u.MinBackoff, u.MaxBackoff
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 10 * time.Second
	}
	log := u.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bo := retry.Backoff(minB, maxB)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		acked := max(u.Spool.Stats().Acked, u.held)
		recs, err := u.Spool.Pending(acked, batch)
		if err != nil {
			return fmt.Errorf("uploading run %s: %w", u.AllocID, err)
		}
		if len(recs) == 0 {
			if untilEmpty {
				return nil
			}
			if err := wait(ctx, poll, u.kick); err != nil {
				return err
			}
			continue
		}
		held, err := u.Sink.Upload(ctx, u.AllocID, recs)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, ErrRefused) {
				return fmt.Errorf("uploading run %s: %w", u.AllocID, err)
			}
			d := bo.NextBackOff()
			log.Warn("uploading run records failed; retrying", "alloc", u.AllocID, "records", len(recs), "first_seq", recs[0].Seq, "retry_in", d, "err", err)
			if err := wait(ctx, d, nil); err != nil {
				return err
			}
			continue
		}
		last := recs[len(recs)-1].Seq
		switch {
		case held > last:
			return fmt.Errorf("uploading run %s: the sink claims to hold seq %d, but only %d were sent", u.AllocID, held, last)
		case held < acked:
			return fmt.Errorf("uploading run %s: the sink lost records it acknowledged (it holds through seq %d, had acknowledged %d); they are no longer in the spool", u.AllocID, held, acked)
		case held == acked:
			// Nothing new held (a partial failure on the other side):
			// retry like a failure, without spinning.
			d := bo.NextBackOff()
			log.Warn("the sink held none of the records sent; retrying", "alloc", u.AllocID, "first_seq", recs[0].Seq, "retry_in", d)
			if err := wait(ctx, d, nil); err != nil {
				return err
			}
			continue
		}
		bo.Reset()
		u.held = held
		if err := u.Spool.Ack(held); err != nil {
			// The sink holds them all the same (a full disk cannot
			// write the ACK file): go on. Until an ACK is written, a
			// restart sends them again, which the sink ignores.
			log.Warn("recording the acknowledgement in the spool failed; going on", "alloc", u.AllocID, "held_through", held, "err", err)
		}
	}
}

func wait(ctx context.Context, d time.Duration, kick <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	case <-kick:
		return nil
	}
}

// Append spools records and wakes the uploader, so an uploader can stand
// in for the spool as the executor's Appender: records go out as soon as
// they are durable here.
func (u *Uploader) Append(recs ...spool.Record) (first, last uint64, err error) {
	first, last, err = u.Spool.Append(recs...)
	if err == nil {
		u.Kick()
	}
	return first, last, err
}

// AppendMarked is Append with the spool's mark (spool.AppendMarked), so
// that an uploader stands in for the spool as a marking executor's
// Appender too.
func (u *Uploader) AppendMarked(mark []byte, recs ...spool.Record) (first, last uint64, err error) {
	first, last, err = u.Spool.AppendMarked(mark, recs...)
	if err == nil {
		u.Kick()
	}
	return first, last, err
}
