package postgres

// disputesMigration (version 7) marks allocations whose log was
// disputed: a record refused because another with different content
// was stored at its seq first. The counters are columns (written by
// AppendRecords alone, like held_through); run_disputes keeps a digest
// of each refused record for an operator to look at, and makes a
// retried batch count once. digest is the hex SHA-256 of the data.
const disputesMigration = `ALTER TABLE allocs ADD COLUMN disputed_records BIGINT NOT NULL DEFAULT 0;
	ALTER TABLE allocs ADD COLUMN first_disputed_seq BIGINT NOT NULL DEFAULT 0;
	CREATE TABLE run_disputes (
		alloc_id TEXT NOT NULL,
		seq BIGINT NOT NULL,
		digest TEXT NOT NULL,
		kind SMALLINT NOT NULL,
		size BIGINT NOT NULL,
		received_at BIGINT NOT NULL,
		PRIMARY KEY (alloc_id, seq, kind, digest)
	);`
