package postgres

// leaseMigration (version 8) holds the leases of once-only work
// (store.Leases): one row per lease, shared by every broker replica.
const leaseMigration = `CREATE TABLE leases (
		name TEXT PRIMARY KEY,
		holder TEXT NOT NULL,
		expires_at BIGINT NOT NULL,
		fence BIGINT NOT NULL
	);`
