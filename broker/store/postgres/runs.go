package postgres

// runsMigration (version 3) adds allocations and their records.
const runsMigration = `CREATE TABLE allocs (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL,
		region TEXT NOT NULL,
		state TEXT NOT NULL,
		node_id TEXT NOT NULL DEFAULT '',
		fence BIGINT NOT NULL DEFAULT 0,
		held_through BIGINT NOT NULL DEFAULT 0,
		created_at BIGINT NOT NULL,
		updated_at BIGINT NOT NULL,
		body TEXT NOT NULL,
		workdir BYTEA
	);
	CREATE INDEX allocs_active ON allocs(state, node_id);
	CREATE INDEX allocs_created ON allocs(created_at);
	CREATE TABLE run_records (
		alloc_id TEXT NOT NULL,
		seq BIGINT NOT NULL,
		kind SMALLINT NOT NULL,
		data BYTEA NOT NULL,
		PRIMARY KEY (alloc_id, seq)
	);`
