// Package sqlstore implements store.Store over database/sql for the SQL
// dialects the broker supports (SQLite, PostgreSQL). The backends differ
// only in their schema types, placeholders and migration lock, which a
// Dialect describes; queries are written once, with ? placeholders.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/conformance"
)

// Dialect is what differs between SQL backends.
type Dialect struct {
	Name string
	// Dollar placeholders ($1, $2…) instead of ?.
	Dollar bool
	// Migrations are applied in order; index+1 is the schema version.
	// Never edit a released migration: append a new one.
	Migrations []string
	// Lock serialises migrations between processes sharing the database
	// (PostgreSQL: an advisory lock); it runs inside the migration tx.
	Lock func(ctx context.Context, tx *sql.Tx) error
	// BatchHeartbeats writes a heartbeat flush as a few multi-row UPDATEs
	// (PostgreSQL: each statement is a round trip) instead of a prepared
	// UPDATE per node (SQLite: in process, where that is cheaper than
	// the join a multi-row UPDATE makes).
	BatchHeartbeats bool
	// Shared says several broker replicas may use the database at once
	// (PostgreSQL), so they share once-only work by lease (Store.Shared).
	Shared bool
	// Listen, where the database carries notifications (PostgreSQL),
	// listens on channel on conn and calls fn with each payload until ctx
	// ends or the connection fails; it must leave conn unusable for the
	// pool (closed) when it returns (Store.Listen).
	Listen func(ctx context.Context, conn *sql.Conn, channel string, listening func(), fn func(payload string)) error
}

// Store is a store.Store over a *sql.DB.
type Store struct {
	db *sql.DB
	d  Dialect
	q  map[string]string // rebound queries
}

var _ store.Store = (*Store)(nil)

// Open migrates db to the newest schema and returns the store. It owns db.
func Open(ctx context.Context, db *sql.DB, d Dialect) (*Store, error) {
	s := &Store{db: db, d: d, q: map[string]string{}}
	for k, v := range queries {
		s.q[k] = s.rebind(v)
	}
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// DB returns the underlying database (for later features' own tables).
func (s *Store) DB() *sql.DB { return s.db }

// SchemaVersion returns the applied schema version.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}

func (s *Store) rebind(q string) string {
	if !s.d.Dollar {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrating %s schema: %w", s.d.Name, err)
	}
	defer tx.Rollback()
	if s.d.Lock != nil {
		if err := s.d.Lock(ctx, tx); err != nil {
			return fmt.Errorf("migrating %s schema: taking lock: %w", s.d.Name, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("migrating %s schema: %w", s.d.Name, err)
	}
	var have int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
		return fmt.Errorf("migrating %s schema: %w", s.d.Name, err)
	}
	if have > len(s.d.Migrations) {
		return fmt.Errorf("migrating %s schema: database is at version %d, this broker knows up to %d: upgrade the broker", s.d.Name, have, len(s.d.Migrations))
	}
	for i := have; i < len(s.d.Migrations); i++ {
		if _, err := tx.ExecContext(ctx, s.d.Migrations[i]); err != nil {
			return fmt.Errorf("migrating %s schema to version %d: %w", s.d.Name, i+1, err)
		}
		if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`), i+1, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("migrating %s schema to version %d: %w", s.d.Name, i+1, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrating %s schema: %w", s.d.Name, err)
	}
	return nil
}

var queries = map[string]string{
	"createToken": `INSERT INTO tokens (id, hash, role, regions, created_at, note) VALUES (?, ?, ?, ?, ?, ?)`,
	"tokenByHash": `SELECT id, hash, role, regions, created_at, note FROM tokens WHERE hash = ?`,
	"listTokens":  `SELECT id, hash, role, regions, created_at, note FROM tokens ORDER BY created_at, id`,
	"deleteToken": `DELETE FROM tokens WHERE id = ?`,
	"agentByKey": `SELECT id, public_key_pem, key_fingerprint, agent_version, token_id, enrolled_at,
		provider, region, zone, price_per_hour, storage_class, bandwidth_gbps, hostname, job_address, job_port_min, job_port_max FROM agents WHERE key_fingerprint = ?`,
	"insertAgent": `INSERT INTO agents (id, public_key_pem, key_fingerprint, agent_version, token_id, enrolled_at,
		provider, region, zone, price_per_hour, storage_class, bandwidth_gbps, hostname, job_address, job_port_min, job_port_max)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	"updateAgent": `UPDATE agents SET agent_version = ?, token_id = ?,
		provider = ?, region = ?, zone = ?, price_per_hour = ?, storage_class = ?, bandwidth_gbps = ?, hostname = ?,
		job_address = ?, job_port_min = ?, job_port_max = ?
		WHERE id = ?`,
	"agent": `SELECT id, public_key_pem, key_fingerprint, agent_version, token_id, enrolled_at,
		provider, region, zone, price_per_hour, storage_class, bandwidth_gbps, hostname, job_address, job_port_min, job_port_max FROM agents WHERE id = ?`,
	"insertNode": `INSERT INTO nodes (id, has_report, last_seen, rtt_ms, updated_at) VALUES (?, FALSE, 0, -1, ?)
		ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at`,
	"insertReport": `INSERT INTO reports (agent_id, report, signature, received_at) VALUES (?, ?, ?, ?)`,
	"indexNode":    `UPDATE nodes SET has_report = TRUE, idx = ?, updated_at = ? WHERE id = ?`,
	// Casts: PostgreSQL would otherwise infer an integer parameter from "? >= 0".
	"heartbeat": `UPDATE nodes SET last_seen = CAST(? AS BIGINT), rtt_ms = CASE WHEN CAST(? AS DOUBLE PRECISION) >= 0 THEN CAST(? AS DOUBLE PRECISION) ELSE rtt_ms END
		WHERE id = ? AND last_seen <= ?`,
	"latestReport": `SELECT agent_id, report, signature, received_at FROM reports WHERE agent_id = ?
		ORDER BY received_at DESC, id DESC LIMIT 1`,
	"countNodes": `SELECT COUNT(*) FROM nodes`,
	"nodes": `SELECT n.id, n.has_report, n.idx, n.last_seen, n.rtt_ms, n.updated_at,
		a.provider, a.region, a.zone, a.price_per_hour, a.storage_class, a.bandwidth_gbps, a.hostname, a.job_address, a.job_port_min, a.job_port_max
		FROM nodes n JOIN agents a ON a.id = n.id ORDER BY n.id`,
	// No ORDER BY: with one, SQLite walks the whole table in id order
	// (no sort) instead of the few recent rows by nodes_updated, and a
	// broker runs this every half second (NodesUpdatedSince sorts).
	"nodesSince": `SELECT n.id, n.has_report, n.idx, n.last_seen, n.rtt_ms, n.updated_at,
		a.provider, a.region, a.zone, a.price_per_hour, a.storage_class, a.bandwidth_gbps, a.hostname, a.job_address, a.job_port_min, a.job_port_max
		FROM nodes n JOIN agents a ON a.id = n.id WHERE n.updated_at >= ?`,
	"liveness":     `SELECT id, last_seen, rtt_ms FROM nodes WHERE last_seen >= ?`,
	"endedGroups":  endedGroupsQuery,
	"recordLaunch": `INSERT INTO launches (node_id, at, failed, reason, alloc_id) VALUES (?, ?, ?, ?, ?)`,
	"launchStats": `SELECT node_id, COUNT(DISTINCT run), COUNT(DISTINCT CASE WHEN failed THEN run END)
		FROM (SELECT node_id, failed, CASE WHEN alloc_id = '' THEN '#' || CAST(id AS TEXT) ELSE alloc_id END AS run
			FROM launches WHERE at >= ?) l
		GROUP BY node_id`,
}

// CreateToken implements store.Store.
func (s *Store) CreateToken(ctx context.Context, t store.Token) error {
	regions, err := json.Marshal(t.Regions)
	if err != nil {
		return fmt.Errorf("storing token: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, s.q["createToken"], t.ID, t.Hash, string(t.Role), string(regions), t.CreatedAt.UnixNano(), t.Note); err != nil {
		return fmt.Errorf("storing token %s: %w", t.ID, err)
	}
	return nil
}

type scanner interface{ Scan(...any) error }

func scanToken(r scanner) (store.Token, error) {
	var t store.Token
	var role, regions string
	var created int64
	if err := r.Scan(&t.ID, &t.Hash, &role, &regions, &created, &t.Note); err != nil {
		return t, err
	}
	t.Role = store.Role(role)
	t.CreatedAt = time.Unix(0, created).UTC()
	if err := json.Unmarshal([]byte(regions), &t.Regions); err != nil {
		return t, fmt.Errorf("token %s: corrupt regions: %w", t.ID, err)
	}
	return t, nil
}

// TokenByHash implements store.Store.
func (s *Store) TokenByHash(ctx context.Context, hash string) (store.Token, error) {
	t, err := scanToken(s.db.QueryRowContext(ctx, s.q["tokenByHash"], hash))
	if errors.Is(err, sql.ErrNoRows) {
		return t, store.ErrNotFound
	}
	if err != nil {
		return t, fmt.Errorf("looking up token: %w", err)
	}
	return t, nil
}

// ListTokens implements store.Store.
func (s *Store) ListTokens(ctx context.Context) ([]store.Token, error) {
	rows, err := s.db.QueryContext(ctx, s.q["listTokens"])
	if err != nil {
		return nil, fmt.Errorf("listing tokens: %w", err)
	}
	defer rows.Close()
	var out []store.Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, fmt.Errorf("listing tokens: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing tokens: %w", err)
	}
	return out, nil
}

// DeleteToken implements store.Store.
func (s *Store) DeleteToken(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, s.q["deleteToken"], id)
	if err != nil {
		return fmt.Errorf("deleting token %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("deleting token %s: %w", id, store.ErrNotFound)
	}
	return nil
}

// EnrollAgent implements store.Store.
func (s *Store) EnrollAgent(ctx context.Context, a store.Agent, allow func(store.Agent) error) (store.Agent, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return a, false, fmt.Errorf("enrolling agent: %w", err)
	}
	defer tx.Rollback()
	l := a.Labels
	// The row stays locked (FOR UPDATE on PostgreSQL; SQLite takes the
	// write lock at BEGIN) until the update: allow judges what is stored.
	existing, err := scanAgent(tx.QueryRowContext(ctx, s.q["agentByKey"]+s.forUpdate(), a.KeyFingerprint))
	created := false
	switch {
	case errors.Is(err, sql.ErrNoRows):
		created = true
		if _, err := tx.ExecContext(ctx, s.q["insertAgent"], a.ID, a.PublicKeyPEM, a.KeyFingerprint, a.AgentVersion, a.TokenID, a.EnrolledAt.UnixNano(),
			l.Provider, l.Region, l.Zone, l.PricePerHour, l.StorageClass, l.BandwidthGbps, l.Hostname, l.JobAddress, l.JobPortMin, l.JobPortMax); err != nil {
			return a, false, fmt.Errorf("enrolling agent: %w", err)
		}
	case err != nil:
		return a, false, fmt.Errorf("enrolling agent: %w", err)
	default:
		if allow != nil {
			if err := allow(existing); err != nil {
				return a, false, err
			}
		}
		a.ID = existing.ID
		if _, err := tx.ExecContext(ctx, s.q["updateAgent"], a.AgentVersion, a.TokenID,
			l.Provider, l.Region, l.Zone, l.PricePerHour, l.StorageClass, l.BandwidthGbps, l.Hostname, l.JobAddress, l.JobPortMin, l.JobPortMax, a.ID); err != nil {
			return a, false, fmt.Errorf("enrolling agent %s: %w", a.ID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, s.q["insertNode"], a.ID, time.Now().UnixNano()); err != nil {
		return a, false, fmt.Errorf("enrolling agent %s: %w", a.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return a, false, fmt.Errorf("enrolling agent %s: %w", a.ID, err)
	}
	stored, err := s.Agent(ctx, a.ID)
	return stored, created, err
}

// Agent implements store.Store.
func (s *Store) Agent(ctx context.Context, id string) (store.Agent, error) {
	a, err := scanAgent(s.db.QueryRowContext(ctx, s.q["agent"], id))
	if errors.Is(err, sql.ErrNoRows) {
		return a, store.ErrNotFound
	}
	if err != nil {
		return a, fmt.Errorf("reading agent %s: %w", id, err)
	}
	return a, nil
}

// scanAgent reads a row of the agent columns ("agent", "agentByKey").
func scanAgent(row *sql.Row) (store.Agent, error) {
	var a store.Agent
	var enrolled int64
	l := &a.Labels
	if err := row.Scan(&a.ID, &a.PublicKeyPEM, &a.KeyFingerprint, &a.AgentVersion, &a.TokenID, &enrolled,
		&l.Provider, &l.Region, &l.Zone, &l.PricePerHour, &l.StorageClass, &l.BandwidthGbps, &l.Hostname, &l.JobAddress, &l.JobPortMin, &l.JobPortMax); err != nil {
		return a, err
	}
	a.EnrolledAt = time.Unix(0, enrolled).UTC()
	return a, nil
}

// index is the stored JSON form of store.NodeIndex. It is a column of its
// own so adding an indexed field needs no migration; the fields dry-run
// filters on are few and filtering happens in the broker.
type index struct {
	store.NodeIndex
	// Runtime is written in the stored form (it shadows NodeIndex's).
	Runtime       storedRuntime `json:"Runtime"`
	GeneratedAtNS int64         `json:"generated_at_ns"`
}

// storedRuntime is conformance.Runtime as the index column has always
// stored it: keys are the Go field names (rows written before the store
// shared the report's type load unchanged, and a broker of the previous
// version sharing the database reads ours). A conversion, which the
// compiler allows only while the two have the same fields, keeps it the
// same type in another spelling.
type storedRuntime struct {
	NvidiaDriver  string
	CUDADriverAPI string
	CUDA          string
	Python        string
	PyTorch       string
	TorchCUDA     string
	CuDNN         string
	Packages      map[string]string `json:",omitempty"`
	FIPSEnabled   bool
}

// storedIndex is ix in the form SaveReport writes.
func storedIndex(ix store.NodeIndex) index {
	idx := index{NodeIndex: ix, Runtime: storedRuntime(ix.Runtime), GeneratedAtNS: ix.GeneratedAt.UnixNano()}
	idx.GeneratedAt = time.Time{}
	return idx
}

// nodeIndex is the index ix stores.
func (ix *index) nodeIndex() store.NodeIndex {
	n := ix.NodeIndex
	n.Runtime = conformance.Runtime(ix.Runtime)
	n.GeneratedAt = time.Unix(0, ix.GeneratedAtNS).UTC()
	return n
}

// SaveReport implements store.Store.
func (s *Store) SaveReport(ctx context.Context, r store.Report) error {
	b, err := json.Marshal(storedIndex(r.Index))
	if err != nil {
		return fmt.Errorf("saving report of %s: %w", r.AgentID, err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("saving report of %s: %w", r.AgentID, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q["insertReport"], r.AgentID, r.Bytes, r.Signature, r.ReceivedAt.UnixNano()); err != nil {
		return fmt.Errorf("saving report of %s: %w", r.AgentID, err)
	}
	res, err := tx.ExecContext(ctx, s.q["indexNode"], string(b), time.Now().UnixNano(), r.AgentID)
	if err != nil {
		return fmt.Errorf("indexing node %s: %w", r.AgentID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("indexing node %s: %w", r.AgentID, store.ErrNotFound)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("saving report of %s: %w", r.AgentID, err)
	}
	return nil
}

// LatestReport implements store.Store.
func (s *Store) LatestReport(ctx context.Context, agentID string) (store.Report, error) {
	var r store.Report
	var received int64
	err := s.db.QueryRowContext(ctx, s.q["latestReport"], agentID).Scan(&r.AgentID, &r.Bytes, &r.Signature, &received)
	if errors.Is(err, sql.ErrNoRows) {
		return r, store.ErrNotFound
	}
	if err != nil {
		return r, fmt.Errorf("reading report of %s: %w", agentID, err)
	}
	r.ReceivedAt = time.Unix(0, received).UTC()
	return r, nil
}

// RecordHeartbeats implements store.Store.
func (s *Store) RecordHeartbeats(ctx context.Context, beats []store.Heartbeat) error {
	if len(beats) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recording heartbeats: %w", err)
	}
	defer tx.Rollback()
	if s.d.BatchHeartbeats {
		// One UPDATE per chunk rather than one per node: a broker
		// flushes every node that beat since the last flush (thousands),
		// and a round trip per row cost more CPU than the beats did.
		merged := mergeBeats(beats)
		for len(merged) > 0 {
			n := min(len(merged), beatsPerStatement)
			q, args := beatsUpdate(merged[:n])
			if _, err := tx.ExecContext(ctx, s.rebind(q), args...); err != nil {
				return fmt.Errorf("recording heartbeats: %w", err)
			}
			merged = merged[n:]
		}
	} else {
		stmt, err := tx.PrepareContext(ctx, s.q["heartbeat"])
		if err != nil {
			return fmt.Errorf("recording heartbeats: %w", err)
		}
		defer stmt.Close()
		for _, b := range beats {
			at := b.At.UnixNano()
			if _, err := stmt.ExecContext(ctx, at, b.RTTMS, b.RTTMS, b.AgentID, at); err != nil {
				return fmt.Errorf("recording heartbeat of %s: %w", b.AgentID, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("recording heartbeats: %w", err)
	}
	return nil
}

// beatsPerStatement bounds the rows of one heartbeat UPDATE (4 parameters
// each; SQLite allows 32,766 parameters, PostgreSQL 65,535).
const beatsPerStatement = 500

// mergedBeat is what a batch's beats of one node amount to, applied as
// one row: the newest time, and the last measured RTT with the time of
// its beat (it counts only if that beat is not older than the stored
// last-seen, as when each beat was applied in turn).
type mergedBeat struct {
	id        string
	at, rttAt int64
	rtt       float64
}

// mergeBeats folds beats per node in order: a beat older than one
// already taken is ignored, as the per-row UPDATE's last_seen <= at did.
func mergeBeats(beats []store.Heartbeat) []mergedBeat {
	out := make([]mergedBeat, 0, len(beats))
	pos := make(map[string]int, len(beats))
	for _, b := range beats {
		at := b.At.UnixNano()
		i, ok := pos[b.AgentID]
		if !ok {
			pos[b.AgentID] = len(out)
			out = append(out, mergedBeat{id: b.AgentID, at: at, rtt: b.RTTMS, rttAt: at})
			continue
		}
		m := &out[i]
		if at < m.at {
			continue
		}
		m.at = at
		if b.RTTMS >= 0 {
			m.rtt, m.rttAt = b.RTTMS, at
		}
	}
	return out
}

// beatsUpdate builds one UPDATE for rows. VALUES columns are named
// column1… on both SQLite and PostgreSQL; the casts type the parameters
// for PostgreSQL. SET reads the row as it was before the update.
func beatsUpdate(rows []mergedBeat) (string, []any) {
	var q strings.Builder
	q.WriteString(`UPDATE nodes SET last_seen = v.column2,
		rtt_ms = CASE WHEN v.column3 >= 0 AND v.column4 >= nodes.last_seen THEN v.column3 ELSE nodes.rtt_ms END
		FROM (VALUES `)
	args := make([]any, 0, 4*len(rows))
	for i, r := range rows {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(CAST(? AS TEXT), CAST(? AS BIGINT), CAST(? AS DOUBLE PRECISION), CAST(? AS BIGINT))")
		args = append(args, r.id, r.at, r.rtt, r.rttAt)
	}
	q.WriteString(`) AS v WHERE nodes.id = v.column1 AND nodes.last_seen <= v.column2`)
	return q.String(), args
}

// Nodes implements store.Store.
func (s *Store) Nodes(ctx context.Context) ([]store.Node, error) {
	// The count makes room for every entry up front; it is a hint, and
	// entries enrolled in between are read all the same.
	var count int
	if err := s.db.QueryRowContext(ctx, s.q["countNodes"]).Scan(&count); err != nil {
		return nil, fmt.Errorf("listing nodes: counting: %w", err)
	}
	return s.nodes(ctx, count, s.q["nodes"])
}

// NodesUpdatedSince implements store.Store.
func (s *Store) NodesUpdatedSince(ctx context.Context, t time.Time) ([]store.Node, error) {
	nodes, err := s.nodes(ctx, 0, s.q["nodesSince"], t.UnixNano())
	// In id order, as Nodes: sorted here, where there are few (see the
	// query).
	slices.SortFunc(nodes, func(a, b store.Node) int { return strings.Compare(a.ID, b.ID) })
	return nodes, err
}

// QueryPlan is the database's plan for the named query with args
// (SQLite's EXPLAIN QUERY PLAN, PostgreSQL's EXPLAIN), one line per step:
// tests check that the queries a broker runs every half second use their
// indexes, which a growing registry would otherwise pay for.
func (s *Store) QueryPlan(ctx context.Context, name string, args ...any) (string, error) {
	q, ok := s.q[name]
	if !ok {
		return "", fmt.Errorf("no query %q", name)
	}
	explain := "EXPLAIN "
	if !s.d.Dollar {
		explain = "EXPLAIN QUERY PLAN "
	}
	rows, err := s.db.QueryContext(ctx, explain+q, args...)
	if err != nil {
		return "", fmt.Errorf("explaining %s: %w", name, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return "", fmt.Errorf("explaining %s: %w", name, err)
	}
	var plan strings.Builder
	vals := make([]any, len(cols))
	for i := range vals {
		vals[i] = new(any)
	}
	for rows.Next() {
		if err := rows.Scan(vals...); err != nil {
			return "", fmt.Errorf("explaining %s: %w", name, err)
		}
		// The step's text is the last column in both databases.
		fmt.Fprintf(&plan, "%v\n", *vals[len(vals)-1].(*any))
	}
	return plan.String(), rows.Err()
}

// Liveness implements store.Store.
func (s *Store) Liveness(ctx context.Context, since time.Time) ([]store.Heartbeat, error) {
	rows, err := s.db.QueryContext(ctx, s.q["liveness"], since.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("reading liveness: %w", err)
	}
	defer rows.Close()
	var out []store.Heartbeat
	for rows.Next() {
		var hb store.Heartbeat
		var seen int64
		if err := rows.Scan(&hb.AgentID, &seen, &hb.RTTMS); err != nil {
			return nil, fmt.Errorf("reading liveness: %w", err)
		}
		hb.At = time.Unix(0, seen).UTC()
		out = append(out, hb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading liveness: %w", err)
	}
	return out, nil
}

// nodes reads registry entries; want is how many the caller expects
// (room is made for them up front: a store.Node is large, and growing a
// slice of 100,000 copied them about twenty times over).
func (s *Store) nodes(ctx context.Context, want int, q string, args ...any) ([]store.Node, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	defer rows.Close()
	out := make([]store.Node, 0, want)
	in := newInterner()
	// The index column is copied into one buffer, row after row (decoded,
	// never kept); never nil before a Scan, so that an empty stored index
	// is told from NULL. An index is about 700 bytes; a longer one (many
	// failed checks) makes a buffer of its own.
	buf := make(sql.RawBytes, 0, 4096)
	var idx sql.RawBytes
	for rows.Next() {
		out = append(out, store.Node{})
		n := &out[len(out)-1]
		var seen, updated int64
		l := &n.Labels
		idx = buf[:0]
		if err := rows.Scan(&n.ID, &n.HasReport, &idx, &seen, &n.RTTMS, &updated,
			&l.Provider, &l.Region, &l.Zone, &l.PricePerHour, &l.StorageClass, &l.BandwidthGbps, &l.Hostname, &l.JobAddress, &l.JobPortMin, &l.JobPortMax); err != nil {
			return nil, fmt.Errorf("listing nodes: %w", err)
		}
		l.Provider, l.Region, l.Zone, l.StorageClass = in.string(l.Provider), in.string(l.Region), in.string(l.Zone), in.string(l.StorageClass)
		if seen > 0 {
			n.LastSeen = time.Unix(0, seen).UTC()
		}
		n.UpdatedAt = time.Unix(0, updated).UTC()
		if n.HasReport && idx != nil {
			if n.Index, err = readIndex(idx, in); err != nil {
				return nil, fmt.Errorf("listing nodes: node %s: corrupt index: %w", n.ID, err)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	return out, nil
}

// RecordLaunch implements store.Store.
func (s *Store) RecordLaunch(ctx context.Context, l store.Launch) error {
	if _, err := s.db.ExecContext(ctx, s.q["recordLaunch"], l.NodeID, l.At.UnixNano(), l.Failed, l.Reason, l.AllocID); err != nil {
		return fmt.Errorf("recording launch on %s: %w", l.NodeID, err)
	}
	return nil
}

// LaunchStats implements store.Store.
func (s *Store) LaunchStats(ctx context.Context, since time.Time) (map[string]store.LaunchStats, error) {
	rows, err := s.db.QueryContext(ctx, s.q["launchStats"], since.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("counting launches: %w", err)
	}
	defer rows.Close()
	out := map[string]store.LaunchStats{}
	for rows.Next() {
		var id string
		var st store.LaunchStats
		if err := rows.Scan(&id, &st.Launches, &st.Failures); err != nil {
			return nil, fmt.Errorf("counting launches: %w", err)
		}
		out[id] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("counting launches: %w", err)
	}
	return out, nil
}

// Close implements store.Store.
func (s *Store) Close() error { return s.db.Close() }
