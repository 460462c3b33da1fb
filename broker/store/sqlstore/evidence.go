package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/gpupass/gpupass/broker/store"
)

var _ store.Evidence = (*Store)(nil)

// PutRunEvidence implements store.Evidence.
func (s *Store) PutRunEvidence(ctx context.Context, e store.RunEvidence, fence uint64) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("storing the run report of %s: %w", e.AllocID, err)
	}
	defer tx.Rollback()
	// The allocation row is locked (FOR UPDATE on PostgreSQL) so a
	// re-placement cannot slip between the fence check and the write.
	var cur int64
	err = tx.QueryRowContext(ctx, s.rebind(`SELECT fence FROM allocs WHERE id = ?`+s.forUpdate()), e.AllocID).Scan(&cur)
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("storing the run report of %s: %w", e.AllocID, err)
	}
	if uint64(cur) != fence {
		return store.ErrStaleFence
	}
	if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO run_evidence (alloc_id, agent_id, report, signature, agent_public_key_pem, received_at)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (alloc_id) DO UPDATE SET agent_id = excluded.agent_id, report = excluded.report, signature = excluded.signature,
			agent_public_key_pem = excluded.agent_public_key_pem, received_at = excluded.received_at`),
		e.AllocID, e.AgentID, e.Report, e.Signature, e.AgentPublicKeyPEM, e.ReceivedAt.UnixNano()); err != nil {
		return fmt.Errorf("storing the run report of %s: %w", e.AllocID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("storing the run report of %s: %w", e.AllocID, err)
	}
	return nil
}

// RunEvidence implements store.Evidence.
func (s *Store) RunEvidence(ctx context.Context, allocID string) (store.RunEvidence, error) {
	e := store.RunEvidence{AllocID: allocID}
	var at int64
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT agent_id, report, signature, agent_public_key_pem, received_at FROM run_evidence WHERE alloc_id = ?`), allocID).
		Scan(&e.AgentID, &e.Report, &e.Signature, &e.AgentPublicKeyPEM, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return e, store.ErrNotFound
	}
	if err != nil {
		return e, fmt.Errorf("reading the run report of %s: %w", allocID, err)
	}
	e.ReceivedAt = fromNS(at)
	return e, nil
}

func (s *Store) forUpdate() string {
	if s.d.Dollar {
		return " FOR UPDATE"
	}
	return ""
}
