package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// SetGroupCI implements store.Runs. The group is the primary key, so a
// second context for one group is refused by the database itself, on
// every replica.
func (s *Store) SetGroupCI(ctx context.Context, group, tokenID string, ci []byte) error {
	if _, err := s.db.ExecContext(ctx, s.rebind(`INSERT INTO group_ci (group_id, token_id, body, created_at) VALUES (?, ?, ?, ?)`),
		group, tokenID, ci, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("storing the CI context of group %s: %w", group, err)
	}
	return nil
}

// GroupCI implements store.Runs.
func (s *Store) GroupCI(ctx context.Context, group string) ([]byte, error) {
	var body []byte
	err := s.db.QueryRowContext(ctx, s.rebind(`SELECT body FROM group_ci WHERE group_id = ?`), group).Scan(&body)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the CI context of group %s: %w", group, err)
	}
	return body, nil
}
