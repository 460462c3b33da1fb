package sqlstore

import (
	"context"
	"fmt"

	"github.com/gpupass/gpupass/broker/store"
)

// CountAllocsByState counts runs by state in one query, for the broker's
// /metrics: a scrape must not read every run.
func (s *Store) CountAllocsByState(ctx context.Context) (map[store.AllocState]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT state, COUNT(*) FROM allocs GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("counting allocations: %w", err)
	}
	defer rows.Close()
	out := map[store.AllocState]int64{}
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("counting allocations: %w", err)
		}
		out[store.AllocState(st)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("counting allocations: %w", err)
	}
	return out, nil
}
