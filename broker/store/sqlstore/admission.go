package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/gpupass/gpupass/broker/store"
)

var _ store.Admissions = (*Store)(nil)

// SetAdmission implements store.Admissions: one upsert by agent id.
func (s *Store) SetAdmission(ctx context.Context, a store.Admission) error {
	if !a.State.Valid() {
		return fmt.Errorf("admission of %s: unknown state %q", a.AgentID, a.State)
	}
	_, err := s.db.ExecContext(ctx, s.rebind(`INSERT INTO node_admissions (agent_id, region, state, decided_by, decided_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (agent_id) DO UPDATE SET region = excluded.region, state = excluded.state,
			decided_by = excluded.decided_by, decided_at = excluded.decided_at`),
		a.AgentID, a.Region, string(a.State), a.DecidedBy, a.DecidedAt.UnixNano())
	if err != nil {
		return fmt.Errorf("storing the admission of %s: %w", a.AgentID, err)
	}
	return nil
}

// Admissions implements store.Admissions.
func (s *Store) Admissions(ctx context.Context, since time.Time) ([]store.Admission, error) {
	var after int64
	if !since.IsZero() {
		after = since.UnixNano()
	}
	rows, err := s.db.QueryContext(ctx, s.rebind(`SELECT agent_id, region, state, decided_by, decided_at FROM node_admissions
		WHERE decided_at >= ? ORDER BY agent_id`), after)
	if err != nil {
		return nil, fmt.Errorf("reading admissions: %w", err)
	}
	defer rows.Close()
	var out []store.Admission
	for rows.Next() {
		var a store.Admission
		var state string
		var at int64
		if err := rows.Scan(&a.AgentID, &a.Region, &state, &a.DecidedBy, &at); err != nil {
			return nil, fmt.Errorf("reading admissions: %w", err)
		}
		a.State, a.DecidedAt = store.AdmissionState(state), time.Unix(0, at).UTC()
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading admissions: %w", err)
	}
	return out, nil
}
