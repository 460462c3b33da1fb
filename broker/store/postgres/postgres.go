// Package postgres is the store for organisations: several broker replicas
// share one PostgreSQL database (pgx v5 through database/sql). Migrations
// take an advisory lock so replicas starting together migrate once.
package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/gpupass/gpupass/broker/store/sqlstore"
)

// Migrations of the PostgreSQL schema; index+1 is the version.
var Migrations = []string{
	`CREATE TABLE tokens (
		id TEXT PRIMARY KEY,
		hash TEXT NOT NULL UNIQUE,
		role TEXT NOT NULL,
		regions TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		note TEXT NOT NULL DEFAULT ''
	);
	CREATE TABLE agents (
		id TEXT PRIMARY KEY,
		public_key_pem BYTEA NOT NULL,
		key_fingerprint TEXT NOT NULL UNIQUE,
		agent_version TEXT NOT NULL DEFAULT '',
		token_id TEXT NOT NULL DEFAULT '',
		enrolled_at BIGINT NOT NULL,
		provider TEXT NOT NULL DEFAULT '',
		region TEXT NOT NULL,
		zone TEXT NOT NULL DEFAULT '',
		price_per_hour DOUBLE PRECISION NOT NULL DEFAULT 0,
		storage_class TEXT NOT NULL DEFAULT '',
		bandwidth_gbps DOUBLE PRECISION NOT NULL DEFAULT 0,
		hostname TEXT NOT NULL DEFAULT ''
	);
	CREATE TABLE nodes (
		id TEXT PRIMARY KEY REFERENCES agents(id),
		has_report BOOLEAN NOT NULL DEFAULT FALSE,
		idx TEXT,
		last_seen BIGINT NOT NULL DEFAULT 0,
		rtt_ms DOUBLE PRECISION NOT NULL DEFAULT -1,
		updated_at BIGINT NOT NULL
	);
	CREATE TABLE reports (
		id BIGSERIAL PRIMARY KEY,
		agent_id TEXT NOT NULL REFERENCES agents(id),
		report BYTEA NOT NULL,
		signature TEXT NOT NULL,
		received_at BIGINT NOT NULL
	);
	CREATE INDEX reports_agent ON reports(agent_id, received_at);
	CREATE TABLE launches (
		id BIGSERIAL PRIMARY KEY,
		node_id TEXT NOT NULL,
		at BIGINT NOT NULL,
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

// migrationLockKey is the advisory lock every gpupass broker takes while
// migrating ("gpupass" in ASCII).
const migrationLockKey = 0x677075706173

// Open connects to the PostgreSQL database at dsn (postgres://…) and
// migrates it.
func Open(ctx context.Context, dsn string) (*sqlstore.Store, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx errors can quote the DSN, which may hold a password.
		return nil, fmt.Errorf("opening postgres store: invalid connection URL")
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening postgres store %s:%d/%s: %w", cfg.Host, cfg.Port, cfg.Database, err)
	}
	s, err := sqlstore.Open(ctx, db, sqlstore.Dialect{
		Name:       "postgres",
		Dollar:     true,
		Migrations: Migrations,
		// A round trip per node per flush cost more than the beats.
		BatchHeartbeats: true,
		Shared:          true,
		Listen:          listen,
		Lock: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLockKey))
			return err
		},
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("opening postgres store: %w", err)
	}
	return s, nil
}

// listen is sqlstore.Dialect.Listen: LISTEN on the pgx connection under
// conn, then each notification's payload to fn. The connection is closed
// when it returns, so that database/sql drops it from the pool instead of
// handing a listening session to the next query. (pgx already closes a
// connection whose wait a context cancelled, and a failed one is gone:
// the close covers any other way out.)
func listen(ctx context.Context, conn *sql.Conn, channel string, listening func(), fn func(payload string)) error {
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("listening: a %T, not a pgx connection", dc)
		}
		pc := sc.Conn()
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = pc.Close(ctx)
		}()
		if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return fmt.Errorf("listening on %s: %w", channel, err)
		}
		listening()
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				return err
			}
			fn(n.Payload)
		}
	})
}
