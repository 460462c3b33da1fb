package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/gpupass/gpupass/broker/store"
)

var _ store.Leases = (*Store)(nil)

// AcquireLease implements store.Leases. One upsert whose update applies
// only to an expired lease or the holder's own, so two replicas racing
// for a free lease cannot both get it: the loser's statement finds the
// winner's row, unexpired, and returns nothing.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (bool, uint64, error) {
	var fence int64
	err := s.db.QueryRowContext(ctx, s.rebind(`INSERT INTO leases (name, holder, expires_at, fence) VALUES (?, ?, ?, 1)
		ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,
			fence = CASE WHEN leases.holder = excluded.holder THEN leases.fence ELSE leases.fence + 1 END
		WHERE leases.holder = excluded.holder OR leases.expires_at <= ?
		RETURNING fence`), name, holder, now.Add(ttl).UnixNano(), now.UnixNano()).Scan(&fence)
	if errors.Is(err, sql.ErrNoRows) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("taking lease %s: %w", name, err)
	}
	return true, uint64(fence), nil
}

// Shared implements store.Leases: whether replicas may share this store.
func (s *Store) Shared() bool { return s.d.Shared }

// ReleaseLease implements store.Leases: the row stays (its fence must
// keep rising), expired.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) error {
	if _, err := s.db.ExecContext(ctx, s.rebind(`UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ?`), name, holder); err != nil {
		return fmt.Errorf("releasing lease %s: %w", name, err)
	}
	return nil
}
