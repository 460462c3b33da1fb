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
// replicas rotating at once still hand out distinct epochs.
func (s *Store) RotateSessionKey(ctx context.Context, agentID string, verifier []byte, at time.Time) (uint64, error) {
	var epoch int64
	err := s.db.QueryRowContext(ctx, s.rebind(`INSERT INTO agent_session_verifiers (agent_id, verifier, epoch, issued_at) VALUES (?, ?, 1, ?)
		ON CONFLICT (agent_id) DO UPDATE SET verifier = excluded.verifier, epoch = agent_session_verifiers.epoch + 1, issued_at = excluded.issued_at
		RETURNING epoch`), agentID, verifier, at.UnixNano()).Scan(&epoch)
	if err != nil {
		return 0, fmt.Errorf("storing the session key verifier of %s: %w", agentID, err)
	}
	return uint64(epoch), nil
}

// SessionVerifier implements store.SessionKeys.
func (s *Store) SessionVerifier(ctx context.Context, agentID string) ([]byte, uint64, error) {
	var verifier []byte
	var epoch int64
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT verifier, epoch FROM agent_session_verifiers WHERE agent_id = ?`), agentID).Scan(&verifier, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, store.ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading the session key verifier of %s: %w", agentID, err)
	}
	return verifier, uint64(epoch), nil
}
