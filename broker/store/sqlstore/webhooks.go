package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/gpupass/gpupass/broker/store"
)

var _ store.Webhooks = (*Store)(nil)

const terminalStates = `('succeeded', 'failed', 'cancelled')`

const deliveryCols = `id, webhook_id, group_id, event, body, state, attempts, next_at, created_at`

// CreateWebhook implements store.Webhooks.
func (s *Store) CreateWebhook(ctx context.Context, w store.Webhook) error {
	regions, err := json.Marshal(w.Regions)
	if err != nil {
		return fmt.Errorf("storing webhook %s: %w", w.ID, err)
	}
	if _, err := s.db.ExecContext(ctx, s.rebind(`INSERT INTO webhooks (id, url, secret, regions, created_at) VALUES (?, ?, ?, ?, ?)`),
		w.ID, w.URL, w.Secret, string(regions), w.CreatedAt.UnixNano()); err != nil {
		return fmt.Errorf("storing webhook %s: %w", w.ID, err)
	}
	return nil
}

// ListWebhooks implements store.Webhooks.
func (s *Store) ListWebhooks(ctx context.Context) ([]store.Webhook, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, url, secret, regions, created_at FROM webhooks ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing webhooks: %w", err)
	}
	defer rows.Close()
	var out []store.Webhook
	for rows.Next() {
		var w store.Webhook
		var regions string
		var created int64
		if err := rows.Scan(&w.ID, &w.URL, &w.Secret, &regions, &created); err != nil {
			return nil, fmt.Errorf("listing webhooks: %w", err)
		}
		if err := json.Unmarshal([]byte(regions), &w.Regions); err != nil {
			return nil, fmt.Errorf("webhook %s: corrupt regions: %w", w.ID, err)
		}
		w.CreatedAt = time.Unix(0, created).UTC()
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing webhooks: %w", err)
	}
	return out, nil
}

// DeleteWebhook implements store.Webhooks.
func (s *Store) DeleteWebhook(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, s.rebind(`DELETE FROM webhooks WHERE id = ?`), id)
	if err != nil {
		return fmt.Errorf("deleting webhook %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// endedGroupsQuery finds the groups of the runs written in the window
// (allocs_updated), kept when every run of theirs has ended
// (allocs_group). The window's rows are not filtered by state: with
// state in the inner WHERE, SQLite searched allocs_active for every
// ended run there has ever been, at each sweep (0.4 s at 300,000 runs,
// against 0.01 s); a group with a run still going is dropped by HAVING
// all the same.
const endedGroupsQuery = `SELECT group_id, MAX(updated_at) FROM allocs
		WHERE group_id IN (SELECT DISTINCT group_id FROM allocs WHERE updated_at > ? AND updated_at <= ? AND group_id <> '')
		GROUP BY group_id
		HAVING SUM(CASE WHEN state IN ` + terminalStates + ` THEN 0 ELSE 1 END) = 0 AND COUNT(*) >= MAX(group_size)
		ORDER BY MAX(updated_at) LIMIT ?`

// EndedGroups implements store.Webhooks.
func (s *Store) EndedGroups(ctx context.Context, since, until time.Time, limit int) ([]store.EndedGroup, error) {
	rows, err := s.db.QueryContext(ctx, s.q["endedGroups"], since.UnixNano(), until.UnixNano(), limit)
	if err != nil {
		return nil, fmt.Errorf("finding ended groups: %w", err)
	}
	defer rows.Close()
	var out []store.EndedGroup
	for rows.Next() {
		var g store.EndedGroup
		var last int64
		if err := rows.Scan(&g.ID, &last); err != nil {
			return nil, fmt.Errorf("finding ended groups: %w", err)
		}
		g.LastUpdate = time.Unix(0, last).UTC()
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("finding ended groups: %w", err)
	}
	return out, nil
}

// CreateDelivery implements store.Webhooks.
func (s *Store) CreateDelivery(ctx context.Context, d store.Delivery) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.rebind(`INSERT INTO webhook_deliveries (`+deliveryCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (webhook_id, group_id) DO NOTHING`),
		d.ID, d.WebhookID, d.Group, d.Event, d.Body, d.State, d.Attempts, d.NextAt.UnixNano(), d.Created.UnixNano())
	if err != nil {
		return false, fmt.Errorf("storing delivery %s: %w", d.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("storing delivery %s: %w", d.ID, err)
	}
	return n == 1, nil
}

func scanDeliveries(rows *sql.Rows) ([]store.Delivery, error) {
	defer rows.Close()
	var out []store.Delivery
	for rows.Next() {
		var d store.Delivery
		var next, created int64
		if err := rows.Scan(&d.ID, &d.WebhookID, &d.Group, &d.Event, &d.Body, &d.State, &d.Attempts, &next, &created); err != nil {
			return nil, err
		}
		d.NextAt, d.Created = time.Unix(0, next).UTC(), time.Unix(0, created).UTC()
		out = append(out, d)
	}
	return out, rows.Err()
}

// DueDeliveries implements store.Webhooks.
func (s *Store) DueDeliveries(ctx context.Context, now time.Time, limit int) ([]store.Delivery, error) {
	rows, err := s.db.QueryContext(ctx, s.rebind(`SELECT `+deliveryCols+` FROM webhook_deliveries
		WHERE state = ? AND next_at <= ? AND webhook_id IN (SELECT id FROM webhooks) ORDER BY next_at, id LIMIT ?`),
		store.DeliveryPending, now.UnixNano(), limit)
	if err != nil {
		return nil, fmt.Errorf("reading due deliveries: %w", err)
	}
	out, err := scanDeliveries(rows)
	if err != nil {
		return nil, fmt.Errorf("reading due deliveries: %w", err)
	}
	return out, nil
}

// ClaimDelivery implements store.Webhooks: a compare-and-swap on next_at.
func (s *Store) ClaimDelivery(ctx context.Context, id string, seen, until time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.rebind(`UPDATE webhook_deliveries SET next_at = ? WHERE id = ? AND state = ? AND next_at = ?`),
		until.UnixNano(), id, store.DeliveryPending, seen.UnixNano())
	if err != nil {
		return false, fmt.Errorf("claiming delivery %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("claiming delivery %s: %w", id, err)
	}
	return n == 1, nil
}

// FinishAttempt implements store.Webhooks.
func (s *Store) FinishAttempt(ctx context.Context, d store.Delivery, a store.Attempt) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recording attempt %d of %s: %w", a.N, d.ID, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO webhook_attempts (delivery_id, n, at, status, error, duration_ns) VALUES (?, ?, ?, ?, ?, ?)`),
		d.ID, a.N, a.At.UnixNano(), a.Status, a.Error, int64(a.Duration)); err != nil {
		return fmt.Errorf("recording attempt %d of %s: %w", a.N, d.ID, err)
	}
	if _, err := tx.ExecContext(ctx, s.rebind(`UPDATE webhook_deliveries SET state = ?, attempts = ?, next_at = ? WHERE id = ?`),
		d.State, d.Attempts, d.NextAt.UnixNano(), d.ID); err != nil {
		return fmt.Errorf("recording attempt %d of %s: %w", a.N, d.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("recording attempt %d of %s: %w", a.N, d.ID, err)
	}
	return nil
}

// Deliveries implements store.Webhooks.
func (s *Store) Deliveries(ctx context.Context, webhookID string, limit int) ([]store.Delivery, error) {
	q, args := `SELECT `+deliveryCols+` FROM webhook_deliveries`, []any{}
	if webhookID != "" {
		q += ` WHERE webhook_id = ?`
		args = append(args, webhookID)
	}
	rows, err := s.db.QueryContext(ctx, s.rebind(q+` ORDER BY created_at DESC, id DESC LIMIT ?`), append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("listing deliveries: %w", err)
	}
	out, err := scanDeliveries(rows)
	if err != nil {
		return nil, fmt.Errorf("listing deliveries: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	idx := map[string]int{}
	ids := make([]any, len(out))
	for i, d := range out {
		idx[d.ID], ids[i] = i, d.ID
	}
	arows, err := s.db.QueryContext(ctx, s.rebind(`SELECT delivery_id, n, at, status, error, duration_ns FROM webhook_attempts
		WHERE delivery_id IN (?`+strings.Repeat(", ?", len(ids)-1)+`) ORDER BY delivery_id, n`), ids...)
	if err != nil {
		return nil, fmt.Errorf("listing delivery attempts: %w", err)
	}
	defer arows.Close()
	for arows.Next() {
		var id string
		var a store.Attempt
		var at, dur int64
		if err := arows.Scan(&id, &a.N, &at, &a.Status, &a.Error, &dur); err != nil {
			return nil, fmt.Errorf("listing delivery attempts: %w", err)
		}
		a.At, a.Duration = time.Unix(0, at).UTC(), time.Duration(dur)
		out[idx[id]].Log = append(out[idx[id]].Log, a)
	}
	if err := arows.Err(); err != nil {
		return nil, fmt.Errorf("listing delivery attempts: %w", err)
	}
	return out, nil
}
