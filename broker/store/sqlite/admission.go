package sqlite

// admissionMigration (version 9) holds admins' decisions on admitting
// nodes (store.Admissions): one row per agent.
const admissionMigration = `CREATE TABLE node_admissions (
		agent_id TEXT PRIMARY KEY,
		region TEXT NOT NULL,
		state TEXT NOT NULL,
		decided_by TEXT NOT NULL,
		decided_at INTEGER NOT NULL
	);
	CREATE INDEX node_admissions_decided ON node_admissions(decided_at);`
