package sqlite

// runsMigration (version 3) adds allocations and their records.
const runsMigration = `CREATE TABLE allocs (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL,
		region TEXT NOT NULL,
		state TEXT NOT NULL,
		node_id TEXT NOT NULL DEFAULT '',
		fence INTEGER NOT NULL DEFAULT 0,
		held_through INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		body TEXT NOT NULL,
		workdir BLOB
	);
	CREATE INDEX allocs_active ON allocs(state, node_id);
	CREATE INDEX allocs_created ON allocs(created_at);
	CREATE TABLE run_records (
		alloc_id TEXT NOT NULL,
		seq INTEGER NOT NULL,
		kind INTEGER NOT NULL,
		data BLOB NOT NULL,
		PRIMARY KEY (alloc_id, seq)
	) WITHOUT ROWID;`
