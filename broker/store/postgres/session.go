package postgres

// sessionMigration (version 5) keeps each agent's heartbeat session key
// (store.SessionKeys) in a table of its own, away from the agent rows
// that listings read.
const sessionMigration = `CREATE TABLE agent_sessions (
		agent_id TEXT PRIMARY KEY,
		session_key BYTEA NOT NULL,
		epoch BIGINT NOT NULL,
		issued_at BIGINT NOT NULL
	);`
