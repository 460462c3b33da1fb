// Package sqlite is the embedded default store: one SQLite file in WAL
// mode, pure Go (modernc.org/sqlite), for a broker that serves a team.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/gpupass/gpupass/broker/store/sqlstore"
)

// Migrations of the SQLite schema; index+1 is the version.
var Migrations = []string{
	`CREATE TABLE tokens (
		id TEXT PRIMARY KEY,
		hash TEXT NOT NULL UNIQUE,
		role TEXT NOT NULL,
		regions TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		note TEXT NOT NULL DEFAULT ''
	);
	CREATE TABLE agents (
		id TEXT PRIMARY KEY,
		public_key_pem BLOB NOT NULL,
		key_fingerprint TEXT NOT NULL UNIQUE,
		agent_version TEXT NOT NULL DEFAULT '',
		token_id TEXT NOT NULL DEFAULT '',
		enrolled_at INTEGER NOT NULL,
		provider TEXT NOT NULL DEFAULT '',
		region TEXT NOT NULL,
		zone TEXT NOT NULL DEFAULT '',
		price_per_hour REAL NOT NULL DEFAULT 0,
		storage_class TEXT NOT NULL DEFAULT '',
		bandwidth_gbps REAL NOT NULL DEFAULT 0,
		hostname TEXT NOT NULL DEFAULT ''
	);
	CREATE TABLE nodes (
		id TEXT PRIMARY KEY REFERENCES agents(id),
		has_report BOOLEAN NOT NULL DEFAULT FALSE,
		idx TEXT,
		last_seen INTEGER NOT NULL DEFAULT 0,
		rtt_ms REAL NOT NULL DEFAULT -1,
		updated_at INTEGER NOT NULL
	);
	CREATE TABLE reports (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		agent_id TEXT NOT NULL REFERENCES agents(id),
		report BLOB NOT NULL,
		signature TEXT NOT NULL,
		received_at INTEGER NOT NULL
	);
	CREATE INDEX reports_agent ON reports(agent_id, received_at);
	CREATE TABLE launches (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		node_id TEXT NOT NULL,
		at INTEGER NOT NULL,
		failed BOOLEAN NOT NULL,
		reason TEXT NOT NULL DEFAULT '',
		alloc_id TEXT NOT NULL DEFAULT ''
	);
	CREATE INDEX launches_at ON launches(at, node_id);`,
	// 2: incremental registry refresh reads recent changes and beats.
	`CREATE INDEX nodes_updated ON nodes(updated_at);
	CREATE INDEX nodes_last_seen ON nodes(last_seen);`,
	// 3: runs (allocations, events and metric points); see runs.go.
	runsMigration,
	// 4: the signed report of each run (audit evidence); see evidence.go.
	evidenceMigration,
	// 5: heartbeat session keys; see session.go.
	sessionMigration,
	// 6: a token's runs by region, newest first (ListAllocs in scope:
	// the distinct regions, then the runs of those in scope).
	`CREATE INDEX allocs_region ON allocs(region, created_at);`,
	// 7: disputed records (a seq sent twice with different content);
	// see disputes.go.
	disputesMigration,
	// 8: leases of once-only work shared by broker replicas; see lease.go.
	leaseMigration,
	// 9: admins' decisions on admitting nodes; see admission.go.
	admissionMigration,
	// 10: session key verifiers instead of session keys; see session.go.
	sessionVerifierMigration,
	// 11: run groups (the runs one submission made); see groups.go.
	groupsMigration,
	// 12: webhooks and their deliveries; see webhooks.go.
	webhooksMigration,
	// 13: the queue of runs waiting for a busy node; see queue.go.
	queueMigration,
	// 14: the CI context a run group was submitted from; see groups.go.
	groupCIMigration,
	// 15: the ranks of a run across several nodes; see gang.go.
	gangMigration,
}

// Open opens (creating it when absent) the SQLite database at path and
// migrates it. The database and its -wal and -shm files are the owner's
// alone (0600): see restrictFiles.
func Open(ctx context.Context, path string) (*sqlstore.Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("opening sqlite store %s: %w", path, err)
	}
	if err := restrictFiles(path); err != nil {
		return nil, fmt.Errorf("opening sqlite store %s: %w", path, err)
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(NORMAL)", "busy_timeout(10000)", "foreign_keys(ON)"} {
		q.Add("_pragma", p)
	}
	// Write transactions take the lock up front so two writers never
	// deadlock upgrading a read lock (SQLITE_BUSY mid-transaction).
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("opening sqlite store %s: %w", path, err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening sqlite store %s: %w", path, err)
	}
	s, err := sqlstore.Open(ctx, db, sqlstore.Dialect{Name: "sqlite", Migrations: Migrations})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("opening sqlite store %s: %w", path, err)
	}
	return s, nil
}

// restrictFiles makes the database file 0600 before SQLite opens it
// (creating it empty when absent, which SQLite takes as a new database)
// and takes group and other bits off an existing one and its -wal and
// -shm files. SQLite creates -wal and -shm with the database file's mode,
// so every file of the store is then the owner's alone whatever the
// process umask: the store holds run logs, evidence and token hashes, and
// a file a local user could read was how the issue #31 reader took a
// node's session key. A store an older broker made 0644 is narrowed here.
func restrictFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(p, fi.Mode().Perm()&0o700); err != nil {
				return fmt.Errorf("narrowing %s to its owner: %w", p, err)
			}
		}
	}
	return nil
}
