package sqlstore

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpupass/gpupass/broker/store"
)

var _ store.Runs = (*Store)(nil)

// Allocations keep the columns the broker filters or updates alone
// (state, node, fence, held_through) as columns and everything else as one
// JSON body, so a new allocation field needs no migration. held_through is
// written only by AppendRecords (its column is authoritative).
var runQueries = map[string]string{
	"insertAlloc": `INSERT INTO allocs (id, name, region, group_id, group_size, gang_id, state, node_id, fence, held_through, created_at, updated_at, queued_at, body, workdir)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)`,
	// allocs_gang (gang_id) finds a gang's other ranks.
	"gangAllocs":  `SELECT ` + allocCols + ` FROM allocs WHERE gang_id = ?`,
	"groupAllocs": `SELECT ` + allocCols + ` FROM allocs WHERE group_id = ? ORDER BY created_at, id LIMIT ?`,
	"alloc":       `SELECT ` + allocCols + ` FROM allocs WHERE id = ?`,
	"allocLock":   `SELECT ` + allocCols + ` FROM allocs WHERE id = ?`,
	"allocWork":   `SELECT workdir FROM allocs WHERE id = ?`,
	"updateAlloc": `UPDATE allocs SET name = ?, region = ?, state = ?, node_id = ?, fence = ?, updated_at = ?, queued_at = ?, body = ? WHERE id = ?`,
	// allocs_queue (region, state, queued_at, id) serves the search and
	// the order.
	"queuedAllocs": `SELECT ` + allocCols + ` FROM allocs
		WHERE region = ? AND state = 'pending' AND queued_at > 0 ORDER BY queued_at, id LIMIT ?`,
	"allocRegions": `SELECT DISTINCT region FROM allocs`,
	"activeAllocs": `SELECT ` + allocCols + ` FROM allocs
		WHERE state NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY created_at, id`,
	"fenceLock": `SELECT fence, held_through FROM allocs WHERE id = ?`,
	"nodeLock":  `SELECT id FROM nodes WHERE id = ?`,
	"nodeHolder": `SELECT id FROM allocs WHERE node_id = ? AND id <> ?
		AND state IN ('matched', 'starting', 'running') LIMIT 1`,
	// A node has at most one holder, and a gang at most 1024 ranks: the
	// rows are few.
	"nodeHolders": `SELECT id FROM allocs WHERE node_id = ?
		AND state IN ('matched', 'starting', 'running')`,
	"seqsAfter": `SELECT seq FROM run_records WHERE alloc_id = ? AND seq > ? ORDER BY seq`,
	"setHeld":   `UPDATE allocs SET held_through = ? WHERE id = ? AND held_through < ?`,
	"insertDispute": `INSERT INTO run_disputes (alloc_id, seq, digest, kind, size, received_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (alloc_id, seq, kind, digest) DO NOTHING`,
	// Casts: PostgreSQL would otherwise infer the parameters' types from
	// the BIGINT columns only in some positions.
	"markDisputed": `UPDATE allocs SET disputed_records = disputed_records + CAST(? AS BIGINT),
		first_disputed_seq = CASE WHEN first_disputed_seq = 0 OR first_disputed_seq > CAST(? AS BIGINT) THEN CAST(? AS BIGINT) ELSE first_disputed_seq END
		WHERE id = ?`,
	"records":     `SELECT seq, kind, data FROM run_records WHERE alloc_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
	"recordsKind": `SELECT seq, kind, data FROM run_records WHERE alloc_id = ? AND seq > ? AND kind = ? ORDER BY seq LIMIT ?`,
	// A checkpoint chunk's data is read up to its header's room only
	// (substr counts bytes of a BLOB in SQLite and of a bytea in
	// PostgreSQL, which can fetch just that slice of a TOASTed value);
	// LogRecords cuts it at the header line.
	"logRecords":     `SELECT seq, kind, ` + logData + ` FROM run_records WHERE alloc_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
	"logRecordsKind": `SELECT seq, kind, ` + logData + ` FROM run_records WHERE alloc_id = ? AND seq > ? AND kind = ? ORDER BY seq LIMIT ?`,
}

// allocCols are the columns decodeAlloc reads: the JSON body and the
// columns kept apart from it.
const allocCols = `body, fence, held_through, disputed_records, first_disputed_seq`

// logData is the data a log shows of a record: everything but a
// checkpoint chunk, of which the start that holds its header line
// (api.CheckpointHeader: a file name and a few numbers).
var logData = fmt.Sprintf("CASE WHEN kind = %d THEN substr(data, 1, %d) ELSE data END", store.RecordCheckpoint, maxHeaderLine)

// maxHeaderLine bounds a checkpoint chunk's header line as a log shows
// it: a 255-byte file name escaped into JSON and the other fields take
// under 2 KiB.
const maxHeaderLine = 4096

func (s *Store) rq(name string) string {
	q := runQueries[name]
	if strings.HasSuffix(name, "Lock") {
		// PostgreSQL: lock the row so concurrent brokers serialise
		// (SQLite transactions here are already exclusive: _txlock=immediate).
		q += s.forUpdate()
	}
	return s.rebind(q)
}

// allocBody is the JSON body: the Alloc minus the columns kept apart.
type allocBody struct {
	store.Alloc
	CreatedNS  int64 `json:"created_ns"`
	UpdatedNS  int64 `json:"updated_ns"`
	StartedNS  int64 `json:"started_ns"`
	FinishedNS int64 `json:"finished_ns"`
	QueuedNS   int64 `json:"queued_ns,omitempty"`
}

func encodeAlloc(a store.Alloc) (string, error) {
	b := allocBody{Alloc: a, CreatedNS: ns(a.CreatedAt), UpdatedNS: ns(a.UpdatedAt), StartedNS: ns(a.StartedAt), FinishedNS: ns(a.FinishedAt), QueuedNS: ns(a.QueuedAt)}
	b.Workdir = nil
	b.CreatedAt, b.UpdatedAt, b.StartedAt, b.FinishedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	out, err := json.Marshal(b)
	return string(out), err
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNS(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func decodeAlloc(r scanner) (store.Alloc, error) {
	var body string
	var fence, held, disputed, firstDisputed int64
	if err := r.Scan(&body, &fence, &held, &disputed, &firstDisputed); err != nil {
		return store.Alloc{}, err
	}
	var b allocBody
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		return store.Alloc{}, fmt.Errorf("corrupt allocation body: %w", err)
	}
	a := b.Alloc
	// The columns are authoritative: AppendRecords writes them without
	// touching the body.
	a.Fence, a.HeldThrough = uint64(fence), uint64(held)
	a.DisputedRecords, a.FirstDisputedSeq = uint64(disputed), uint64(firstDisputed)
	a.CreatedAt, a.UpdatedAt, a.StartedAt, a.FinishedAt = fromNS(b.CreatedNS), fromNS(b.UpdatedNS), fromNS(b.StartedNS), fromNS(b.FinishedNS)
	a.QueuedAt = fromNS(b.QueuedNS)
	return a, nil
}

// CreateAlloc implements store.Runs.
func (s *Store) CreateAlloc(ctx context.Context, a store.Alloc) error {
	return s.insertAlloc(ctx, s.db, a)
}

// CreateAllocs implements store.Runs.
func (s *Store) CreateAllocs(ctx context.Context, as []store.Alloc) error {
	if len(as) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("storing allocations: %w", err)
	}
	defer tx.Rollback()
	for _, a := range as {
		if err := s.insertAlloc(ctx, tx, a); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("storing allocations %s…: %w", as[0].ID, err)
	}
	return nil
}

// execer is what insertAlloc writes through: the database or a
// transaction.
type execer interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
}

func (s *Store) insertAlloc(ctx context.Context, db execer, a store.Alloc) error {
	now := time.Now().UTC()
	if a.CreatedAt.IsZero() {
		a.CreatedAt = now
	}
	a.UpdatedAt = now
	body, err := encodeAlloc(a)
	if err != nil {
		return fmt.Errorf("storing allocation %s: %w", a.ID, err)
	}
	if _, err := db.ExecContext(ctx, s.rq("insertAlloc"), a.ID, a.Name, a.Region, a.Group, a.GroupSize, a.Gang, string(a.State), a.NodeID, int64(a.Fence),
		a.CreatedAt.UnixNano(), a.UpdatedAt.UnixNano(), queuedNS(a), body, a.Workdir); err != nil {
		return fmt.Errorf("storing allocation %s: %w", a.ID, err)
	}
	return nil
}

// Alloc implements store.Runs.
func (s *Store) Alloc(ctx context.Context, id string) (store.Alloc, error) {
	a, err := decodeAlloc(s.db.QueryRowContext(ctx, s.rq("alloc"), id))
	if errors.Is(err, sql.ErrNoRows) {
		return a, store.ErrNotFound
	}
	if err != nil {
		return a, fmt.Errorf("reading allocation %s: %w", id, err)
	}
	return a, nil
}

// Workdir implements store.Runs.
func (s *Store) Workdir(ctx context.Context, id string) ([]byte, error) {
	var w []byte
	err := s.db.QueryRowContext(ctx, s.rq("allocWork"), id).Scan(&w)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading work dir of %s: %w", id, err)
	}
	return w, nil
}

// UpdateAlloc implements store.Runs.
func (s *Store) UpdateAlloc(ctx context.Context, id string, fn func(a *store.Alloc) error) (store.Alloc, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Alloc{}, fmt.Errorf("updating allocation %s: %w", id, err)
	}
	defer tx.Rollback()
	a, err := decodeAlloc(tx.QueryRowContext(ctx, s.rq("allocLock"), id))
	if errors.Is(err, sql.ErrNoRows) {
		return a, store.ErrNotFound
	}
	if err != nil {
		return a, fmt.Errorf("updating allocation %s: %w", id, err)
	}
	before := a
	if err := fn(&a); err != nil {
		return a, err
	}
	if a.State.HoldsNode() && a.NodeID != "" && (a.NodeID != before.NodeID || !before.State.HoldsNode()) {
		if err := s.nodeFree(ctx, tx, a.NodeID, id); err != nil {
			return a, err
		}
	}
	a.ID = id
	a.UpdatedAt = time.Now().UTC()
	body, err := encodeAlloc(a)
	if err != nil {
		return a, fmt.Errorf("updating allocation %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, s.rq("updateAlloc"), a.Name, a.Region, string(a.State), a.NodeID, int64(a.Fence),
		a.UpdatedAt.UnixNano(), queuedNS(a), body, id); err != nil {
		return a, fmt.Errorf("updating allocation %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return a, fmt.Errorf("updating allocation %s: %w", id, err)
	}
	return a, nil
}

// nodeFree returns ErrNodeBusy when an allocation other than id holds
// node. Two placements on one node would otherwise both pass, each having
// locked only its own allocation: on PostgreSQL the node's row is locked
// first, so the second waits for the first to commit and then, reading
// anew (READ COMMITTED), sees it; SQLite's write transactions are
// serial already.
func (s *Store) nodeFree(ctx context.Context, tx *sql.Tx, node, id string) error {
	var got string
	err := tx.QueryRowContext(ctx, s.rq("nodeLock"), node).Scan(&got)
	if err != nil && !errors.Is(err, sql.ErrNoRows) { // an unknown node has no row to lock; placement picks enrolled ones
		return fmt.Errorf("updating allocation %s: locking node %s: %w", id, node, err)
	}
	err = tx.QueryRowContext(ctx, s.rq("nodeHolder"), node, id).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("updating allocation %s: checking node %s: %w", id, node, err)
	}
	return fmt.Errorf("updating allocation %s: node %s holds %s: %w", id, node, got, store.ErrNodeBusy)
}

// UpdateAllocs implements store.Runs. The rows are locked in id order
// and the nodes they move onto in node order, so two gang leases that
// share allocations or nodes wait for each other instead of deadlocking.
func (s *Store) UpdateAllocs(ctx context.Context, ids []string, fn func(as []*store.Alloc) error) ([]store.Alloc, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	what := "updating allocations " + strings.Join(ids, ", ")
	if len(ids) > 4 {
		what = fmt.Sprintf("updating allocations %s… (%d)", strings.Join(ids[:4], ", "), len(ids))
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer tx.Rollback()
	order := slices.Clone(ids)
	slices.Sort(order)
	if len(slices.Compact(order)) != len(ids) {
		return nil, fmt.Errorf("%s: an allocation is named twice", what)
	}
	byID := make(map[string]store.Alloc, len(ids))
	for _, id := range order {
		a, err := decodeAlloc(tx.QueryRowContext(ctx, s.rq("allocLock"), id))
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("%s: %s: %w", what, id, store.ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		byID[id] = a
	}
	before := make([]store.Alloc, len(ids))
	ptrs := make([]*store.Alloc, len(ids))
	for i, id := range ids {
		before[i] = byID[id]
		a := byID[id]
		ptrs[i] = &a
	}
	if err := fn(ptrs); err != nil {
		return nil, err
	}
	// The nodes the set holds after fn: each at most once, and none
	// held by an allocation outside the set (whose rows in the
	// database are still as read: nothing is written yet).
	holds := map[string]string{}
	var moved []string
	for i, a := range ptrs {
		if !a.State.HoldsNode() || a.NodeID == "" {
			continue
		}
		if other, ok := holds[a.NodeID]; ok {
			return nil, fmt.Errorf("%s: %s and %s both on node %s: %w", what, other, ids[i], a.NodeID, store.ErrNodeBusy)
		}
		holds[a.NodeID] = ids[i]
		if a.NodeID != before[i].NodeID || !before[i].State.HoldsNode() {
			moved = append(moved, a.NodeID)
		}
	}
	slices.Sort(moved)
	for _, node := range moved {
		if err := s.nodeFreeOf(ctx, tx, node, byID, what); err != nil {
			return nil, err
		}
	}
	now := time.Now().UTC()
	out := make([]store.Alloc, len(ids))
	for i, a := range ptrs {
		a.ID, a.UpdatedAt = ids[i], now
		// The gang a rank belongs to is fixed when it is stored.
		a.Gang = before[i].Gang
		body, err := encodeAlloc(*a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if _, err := tx.ExecContext(ctx, s.rq("updateAlloc"), a.Name, a.Region, string(a.State), a.NodeID, int64(a.Fence),
			a.UpdatedAt.UnixNano(), queuedNS(*a), body, a.ID); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out[i] = *a
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// nodeFreeOf is nodeFree for a set of allocations: ErrNodeBusy when an
// allocation outside set holds node (the node's row locked first, as
// nodeFree does).
func (s *Store) nodeFreeOf(ctx context.Context, tx *sql.Tx, node string, set map[string]store.Alloc, what string) error {
	var got string
	err := tx.QueryRowContext(ctx, s.rq("nodeLock"), node).Scan(&got)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: locking node %s: %w", what, node, err)
	}
	rows, err := tx.QueryContext(ctx, s.rq("nodeHolders"), node)
	if err != nil {
		return fmt.Errorf("%s: checking node %s: %w", what, node, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(&got); err != nil {
			return fmt.Errorf("%s: checking node %s: %w", what, node, err)
		}
		if _, ours := set[got]; !ours {
			return fmt.Errorf("%s: node %s holds %s: %w", what, node, got, store.ErrNodeBusy)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: checking node %s: %w", what, node, err)
	}
	return nil
}

// GangAllocs implements store.Runs.
func (s *Store) GangAllocs(ctx context.Context, gang string) ([]store.Alloc, error) {
	if gang == "" {
		return nil, nil
	}
	out, err := s.allocs(ctx, s.rq("gangAllocs"), gang)
	if err != nil {
		return nil, fmt.Errorf("listing gang %s: %w", gang, err)
	}
	slices.SortFunc(out, func(x, y store.Alloc) int { return cmp.Compare(x.Rank, y.Rank) })
	return out, nil
}

func (s *Store) allocs(ctx context.Context, q string, args ...any) ([]store.Alloc, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing allocations: %w", err)
	}
	defer rows.Close()
	var out []store.Alloc
	for rows.Next() {
		a, err := decodeAlloc(rows)
		if err != nil {
			return nil, fmt.Errorf("listing allocations: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing allocations: %w", err)
	}
	return out, nil
}

// GroupAllocs implements store.Runs.
func (s *Store) GroupAllocs(ctx context.Context, group string, limit int) ([]store.Alloc, error) {
	if group == "" {
		// Runs stored before groups have '': they are no group.
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, s.rq("groupAllocs"), group, limit)
	if err != nil {
		return nil, fmt.Errorf("listing group %s: %w", group, err)
	}
	defer rows.Close()
	var out []store.Alloc
	for rows.Next() {
		a, err := decodeAlloc(rows)
		if err != nil {
			return nil, fmt.Errorf("listing group %s: %w", group, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing group %s: %w", group, err)
	}
	return out, nil
}

// ListAllocs implements store.Runs.
func (s *Store) ListAllocs(ctx context.Context, limit int, inScope func(string) bool) ([]store.Alloc, error) {
	return s.ListAllocsAfter(ctx, store.AllocKey{}, limit, inScope)
}

// ListAllocsAfter implements store.Runs. With inScope, the regions that
// hold runs (a handful) are read first and the listing asks for those
// only.
func (s *Store) ListAllocsAfter(ctx context.Context, after store.AllocKey, limit int, inScope func(string) bool) ([]store.Alloc, error) {
	if limit <= 0 {
		limit = 100
	}
	var where []string
	var args []any
	if inScope != nil {
		rows, err := s.db.QueryContext(ctx, s.rq("allocRegions"))
		if err != nil {
			return nil, fmt.Errorf("listing allocations: %w", err)
		}
		var regions []any
		for rows.Next() {
			var r string
			if err := rows.Scan(&r); err != nil {
				rows.Close()
				return nil, fmt.Errorf("listing allocations: %w", err)
			}
			if inScope(r) {
				regions = append(regions, r)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("listing allocations: %w", err)
		}
		if len(regions) == 0 {
			return nil, nil
		}
		where = append(where, `region IN (?`+strings.Repeat(", ?", len(regions)-1)+`)`)
		args = append(args, regions...)
	}
	if after.ID != "" {
		// A range on created_at alone, then the tie-break: the index on
		// created_at serves both the range and the order. Spelled as
		// (created_at < ? OR (created_at = ? AND id < ?)), SQLite unions
		// two index lookups and sorts every older row, so a page cost
		// grew with the runs behind it.
		at := after.CreatedAt.UnixNano()
		where = append(where, `created_at <= ? AND (created_at < ? OR id < ?)`)
		args = append(args, at, at, after.ID)
	}
	// Runs, not ranks: a gang's ranks 1.. are read through their run
	// (GangAllocs).
	where = append(where, `gang_id = ''`)
	q := `SELECT ` + allocCols + ` FROM allocs WHERE ` + strings.Join(where, ` AND `)
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	return s.allocs(ctx, s.rebind(q), append(args, limit)...)
}

// queuedNS is the queued_at column of a: its QueuedAt while it is
// pending, else 0, so the queue holds pending runs only whatever the
// broker left in the field.
func queuedNS(a store.Alloc) int64 {
	if a.State != store.AllocPending {
		return 0
	}
	return ns(a.QueuedAt)
}

// QueuedAllocs implements store.Runs.
func (s *Store) QueuedAllocs(ctx context.Context, region string, limit int) ([]store.Alloc, error) {
	if limit <= 0 {
		limit = 1000
	}
	out, err := s.allocs(ctx, s.rq("queuedAllocs"), region, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the queue of %s: %w", region, err)
	}
	return out, nil
}

// ActiveAllocs implements store.Runs.
func (s *Store) ActiveAllocs(ctx context.Context) ([]store.Alloc, error) {
	return s.allocs(ctx, s.rq("activeAllocs"))
}

// recordsPerInsert bounds rows per multi-row INSERT (4 parameters each;
// well under SQLite's and PostgreSQL's parameter limits) and seqs per
// IN list.
const recordsPerInsert = 256

// AppendRecords implements store.Runs.
func (s *Store) AppendRecords(ctx context.Context, allocID string, fence uint64, recs []store.RunRecord) (store.AppendResult, error) {
	var res store.AppendResult
	for _, r := range recs {
		if r.Seq == 0 {
			return res, fmt.Errorf("storing records of %s: seq 0 is not a valid sequence number (they start at 1)", allocID)
		}
		if r.Seq > math.MaxInt64 {
			return res, fmt.Errorf("storing records of %s: seq %d is past the largest the store keeps (%d)", allocID, r.Seq, int64(math.MaxInt64))
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return res, fmt.Errorf("storing records of %s: %w", allocID, err)
	}
	defer tx.Rollback()
	// The row stays locked to the commit (FOR UPDATE on PostgreSQL): a
	// plain read under READ COMMITTED would let a node whose run was
	// re-placed store records under the new placement, and two appends
	// read the same held_through and leave the mark below what they
	// stored. It also makes the read of what is stored below and the
	// writes after it one step: no other append of this run interleaves.
	var cur, held int64
	err = tx.QueryRowContext(ctx, s.rq("fenceLock"), allocID).Scan(&cur, &held)
	if errors.Is(err, sql.ErrNoRows) {
		return res, store.ErrNotFound
	}
	if err != nil {
		return res, fmt.Errorf("storing records of %s: %w", allocID, err)
	}
	res.HeldThrough = uint64(held)
	if uint64(cur) != fence {
		return res, store.ErrStaleFence
	}
	// What is stored past the mark (usually nothing; records after a
	// gap otherwise). Everything at or below the mark is stored.
	after, err := s.seqsAfter(ctx, tx, allocID, held)
	if err != nil {
		return res, fmt.Errorf("storing records of %s: %w", allocID, err)
	}
	// Split the batch: new seqs are inserted; a seq already stored (or
	// twice in this batch) is compared with what is there. An agent's
	// batch runs in increasing seq order, which needs no map to find
	// repeats (maps cost a measurable share of ingest).
	increasing := true
	for i := 1; i < len(recs) && increasing; i++ {
		increasing = recs[i].Seq > recs[i-1].Seq
	}
	var inBatch map[uint64]int // seq -> index in recs, for an unordered batch
	if !increasing {
		inBatch = make(map[uint64]int, len(recs))
	}
	var fresh []store.RunRecord
	var check []int // indexes in recs of seqs already stored
	var disputed []store.RunRecord
	for i, r := range recs {
		if inBatch != nil {
			if prev, ok := inBatch[r.Seq]; ok {
				if !sameRecord(recs[prev], r) {
					disputed = append(disputed, r)
				}
				continue
			}
			inBatch[r.Seq] = i
		}
		if _, stored := slices.BinarySearch(after, r.Seq); stored || r.Seq <= uint64(held) {
			check = append(check, i)
			continue
		}
		fresh = append(fresh, r)
	}
	for len(check) > 0 {
		n := min(len(check), recordsPerInsert)
		stored, err := s.recordsAt(ctx, tx, allocID, recs, check[:n])
		if err != nil {
			return res, fmt.Errorf("storing records of %s: %w", allocID, err)
		}
		for _, i := range check[:n] {
			if st, ok := stored[recs[i].Seq]; ok && !sameRecord(st, recs[i]) {
				disputed = append(disputed, recs[i])
			}
		}
		check = check[n:]
	}
	if err := s.recordDisputes(ctx, tx, allocID, disputed); err != nil {
		return res, fmt.Errorf("storing records of %s: %w", allocID, err)
	}
	// Multi-row inserts: one statement per chunk instead of per record
	// is what makes tens of thousands of events per second possible.
	for rest := fresh; len(rest) > 0; {
		n := min(len(rest), recordsPerInsert)
		var q strings.Builder
		q.WriteString(`INSERT INTO run_records (alloc_id, seq, kind, data) VALUES `)
		args := make([]any, 0, 4*n)
		for i, r := range rest[:n] {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, ?, ?, ?)")
			args = append(args, allocID, int64(r.Seq), int(r.Kind), r.Data)
		}
		// No conflict is possible under the row lock; DO NOTHING keeps
		// the first record should one ever be.
		q.WriteString(` ON CONFLICT (alloc_id, seq) DO NOTHING`)
		if _, err := tx.ExecContext(ctx, s.rebind(q.String()), args...); err != nil {
			return res, fmt.Errorf("storing records of %s: %w", allocID, err)
		}
		rest = rest[n:]
	}
	// Advance the gap-free mark over what is stored now: the seqs
	// stored before (after) and those just inserted (fresh), both sorted.
	if !increasing {
		slices.SortFunc(fresh, func(a, b store.RunRecord) int { return cmp.Compare(a.Seq, b.Seq) })
	}
	next := uint64(held)
	for i, j := 0, 0; ; {
		for i < len(after) && after[i] <= next {
			i++
		}
		for j < len(fresh) && fresh[j].Seq <= next {
			j++
		}
		if (i < len(after) && after[i] == next+1) || (j < len(fresh) && fresh[j].Seq == next+1) {
			next++
			continue
		}
		break
	}
	if next > uint64(held) {
		if _, err := tx.ExecContext(ctx, s.rq("setHeld"), int64(next), allocID, int64(next)); err != nil {
			return res, fmt.Errorf("storing records of %s: %w", allocID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return res, fmt.Errorf("storing records of %s: %w", allocID, err)
	}
	res.HeldThrough = next
	for _, r := range disputed {
		res.Disputed = append(res.Disputed, r.Seq)
	}
	slices.Sort(res.Disputed)
	res.Disputed = slices.Compact(res.Disputed)
	return res, nil
}

// sameRecord reports whether b is a re-send of a: same kind, same bytes.
func sameRecord(a, b store.RunRecord) bool {
	return a.Kind == b.Kind && bytes.Equal(a.Data, b.Data)
}

// seqsAfter returns the stored seqs of allocID above held, ascending.
func (s *Store) seqsAfter(ctx context.Context, tx *sql.Tx, allocID string, held int64) ([]uint64, error) {
	rows, err := tx.QueryContext(ctx, s.rq("seqsAfter"), allocID, held)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []uint64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, err
		}
		out = append(out, uint64(seq))
	}
	return out, rows.Err()
}

// recordsAt reads the stored records of allocID at the seqs of recs[idx]
// (at most recordsPerInsert of them).
func (s *Store) recordsAt(ctx context.Context, tx *sql.Tx, allocID string, recs []store.RunRecord, idx []int) (map[uint64]store.RunRecord, error) {
	args := make([]any, 0, len(idx)+1)
	args = append(args, allocID)
	for _, i := range idx {
		args = append(args, int64(recs[i].Seq))
	}
	q := `SELECT seq, kind, data FROM run_records WHERE alloc_id = ? AND seq IN (?` + strings.Repeat(", ?", len(idx)-1) + `)`
	rows, err := tx.QueryContext(ctx, s.rebind(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[uint64]store.RunRecord, len(idx))
	for rows.Next() {
		var seq int64
		var k int
		var r store.RunRecord
		if err := rows.Scan(&seq, &k, &r.Data); err != nil {
			return nil, err
		}
		r.Seq, r.Kind = uint64(seq), store.RecordKind(k)
		out[r.Seq] = r
	}
	return out, rows.Err()
}

// recordDisputes keeps a digest of each refused record (not its data: a
// sender could otherwise store without bound by disputing) and counts
// the distinct ones on the allocation, so a sender retrying the same
// batch does not inflate the count.
func (s *Store) recordDisputes(ctx context.Context, tx *sql.Tx, allocID string, disputed []store.RunRecord) error {
	if len(disputed) == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	var added int64
	lowest := disputed[0].Seq
	for _, r := range disputed {
		sum := sha256.Sum256(r.Data)
		res, err := tx.ExecContext(ctx, s.rq("insertDispute"), allocID, int64(r.Seq), hex.EncodeToString(sum[:]), int(r.Kind), len(r.Data), now)
		if err != nil {
			return fmt.Errorf("recording the disputed record at seq %d: %w", r.Seq, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("recording the disputed record at seq %d: %w", r.Seq, err)
		}
		added += n
		lowest = min(lowest, r.Seq)
	}
	if added == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, s.rq("markDisputed"), added, int64(lowest), int64(lowest), allocID); err != nil {
		return fmt.Errorf("marking the log disputed: %w", err)
	}
	return nil
}

// Records implements store.Runs.
func (s *Store) Records(ctx context.Context, allocID string, afterSeq uint64, kind store.RecordKind, limit int) ([]store.RunRecord, error) {
	return s.records(ctx, "records", allocID, afterSeq, kind, limit)
}

// LogRecords implements store.Runs.
func (s *Store) LogRecords(ctx context.Context, allocID string, afterSeq uint64, kind store.RecordKind, limit int) ([]store.RunRecord, error) {
	recs, err := s.records(ctx, "logRecords", allocID, afterSeq, kind, limit)
	for i, r := range recs {
		if r.Kind == store.RecordCheckpoint {
			if line, _, ok := bytes.Cut(r.Data, []byte{'\n'}); ok {
				recs[i].Data = line
			}
		}
	}
	return recs, err
}

// records runs query (or its Kind variant for a kind other than 0).
func (s *Store) records(ctx context.Context, query, allocID string, afterSeq uint64, kind store.RecordKind, limit int) ([]store.RunRecord, error) {
	if limit <= 0 {
		limit = 1000
	}
	var rows *sql.Rows
	var err error
	if kind == 0 {
		rows, err = s.db.QueryContext(ctx, s.rq(query), allocID, int64(afterSeq), limit)
	} else {
		rows, err = s.db.QueryContext(ctx, s.rq(query+"Kind"), allocID, int64(afterSeq), int(kind), limit)
	}
	if err != nil {
		return nil, fmt.Errorf("reading records of %s: %w", allocID, err)
	}
	defer rows.Close()
	var out []store.RunRecord
	for rows.Next() {
		var r store.RunRecord
		var seq int64
		var k int
		if err := rows.Scan(&seq, &k, &r.Data); err != nil {
			return nil, fmt.Errorf("reading records of %s: %w", allocID, err)
		}
		r.Seq, r.Kind = uint64(seq), store.RecordKind(k)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading records of %s: %w", allocID, err)
	}
	return out, nil
}
