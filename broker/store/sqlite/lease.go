package sqlite

// leaseMigration (version 8) holds the leases of once-only work
// (store.Leases): one row per lease.
const leaseMigration = `CREATE TABLE leases (
		name TEXT PRIMARY KEY,
		holder TEXT NOT NULL,
		expires_at INTEGER NOT NULL,
		fence INTEGER NOT NULL
	);`
