package sqlstore

import (
	"context"
	"fmt"

	"github.com/gpupass/gpupass/broker/store"
)

var _ store.LogUsage = (*Store)(nil)

// LogBytes implements store.LogUsage. It reads only the rows above after
// through the primary key (alloc_id, seq); length() counts the bytes of a
// BLOB in SQLite and of a bytea in PostgreSQL.
func (s *Store) LogBytes(ctx context.Context, allocID string, after, through uint64) (above, within int64, err error) {
	err = s.db.QueryRowContext(ctx, s.rebind(`SELECT COALESCE(SUM(length(data)), 0), COALESCE(SUM(CASE WHEN seq <= ? THEN length(data) ELSE 0 END), 0)
		FROM run_records WHERE alloc_id = ? AND seq > ? AND kind <> ?`), int64(through), allocID, int64(after), int(store.RecordCheckpoint)).Scan(&above, &within)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the log size of %s: %w", allocID, err)
	}
	return above, within, nil
}
