package sqlite

// disputesMigration (version 7) marks allocations whose log was
// disputed: a record refused because another with different content
// was stored at its seq first. The counters are columns (written by
// AppendRecords alone, like held_through); run_disputes keeps a digest
// of each refused record for an operator to look at, and makes a
// retried batch count once. digest is the hex SHA-256 of the data.
const disputesMigration = `ALTER TABLE allocs ADD COLUMN disputed_records INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE allocs ADD COLUMN first_disputed_seq INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE run_disputes (
		alloc_id TEXT NOT NULL,
		seq INTEGER NOT NULL,
		digest TEXT NOT NULL,
		kind INTEGER NOT NULL,
		size INTEGER NOT NULL,
		received_at INTEGER NOT NULL,
		PRIMARY KEY (alloc_id, seq, kind, digest)
	) WITHOUT ROWID;`
