package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/gpupass/gpupass/broker/store"
)

var _ store.SessionKeys = (*Store)(nil)

// RotateSessionKey implements store.SessionKeys. One statement, so two
// replicas rotating at once still hand out distinct epochs. Errors never
// carry the key.
func (s *Store) RotateSessionKey(ctx context.Context, agentID string, key []byte, at time.Time) (uint64, error) {
	var epoch int64
	err := s.db.QueryRowContext(ctx, s.rebind(`INSERT INTO agent_sessions (agent_id, session_key, epoch, issued_at) VALUES (?, ?, 1, ?)
		ON CONFLICT (agent_id) DO UPDATE SET session_key = excluded.session_key, epoch = agent_sessions.epoch + 1, issued_at = excluded.issued_at
		RETURNING epoch`), agentID, key, at.UnixNano()).Scan(&epoch)
	if err != nil {
		return 0, fmt.Errorf("storing the session key of %s: %w", agentID, err)
	}
	return uint64(epoch), nil
}

// SessionKey implements store.SessionKeys.
func (s *Store) SessionKey(ctx context.Context, agentID string) ([]byte, uint64, error) {
	var key []byte
	var epoch int64
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT session_key, epoch FROM agent_sessions WHERE agent_id = ?`), agentID).Scan(&key, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, store.ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading the session key of %s: %w", agentID, err)
	}
	return key, uint64(epoch), nil
}
