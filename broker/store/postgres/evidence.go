package postgres

// evidenceMigration (version 4) keeps each run's signed conformance
// report (the audit's evidence) apart from the allocation body, which
// every state update reads and writes.
const evidenceMigration = `CREATE TABLE run_evidence (
		alloc_id TEXT PRIMARY KEY,
		agent_id TEXT NOT NULL,
		report BYTEA NOT NULL,
		signature TEXT NOT NULL,
		agent_public_key_pem BYTEA NOT NULL,
		received_at BIGINT NOT NULL
	);`
