package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpupass/gpupass/broker/store"
)

// signalChannel is the PostgreSQL channel of gpupass brokers' wake-ups.
const signalChannel = "gpupass_wake"

var _ store.Signals = (*Store)(nil)

// Signal implements store.Signals (NOTIFY); errors.ErrUnsupported on a
// dialect without Listen (SQLite: one broker per file).
func (s *Store) Signal(ctx context.Context, payload string) error {
	if s.d.Listen == nil {
		return errors.ErrUnsupported
	}
	if len(payload) > store.MaxSignal {
		return fmt.Errorf("signal of %d bytes: at most %d", len(payload), store.MaxSignal)
	}
	_, err := s.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, signalChannel, payload)
	return err
}

// Listen implements store.Signals on a connection of its own, taken from
// the pool and never given back to it (a connection that listens would
// go on collecting notifications under other queries).
func (s *Store) Listen(ctx context.Context, listening func(), fn func(payload string)) error {
	if s.d.Listen == nil {
		return errors.ErrUnsupported
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return s.d.Listen(ctx, conn, signalChannel, listening, fn)
}
