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

// sessionVerifierMigration (version 10) replaces the table of session keys
// with one of their verifiers (store.SessionKeys): a copy of the database
// must not be enough to make a node's MAC (issue #31). The keys of the
// old table are dropped, not hashed into verifiers: they were readable by
// whoever could read the database, so none of them may prove a node any
// more. Agents holding one are refused at their next call and enroll
// again for a new key on their own (gpupass-agent does so whenever a beat
// is refused). Epochs start again at 1; a refused old key is refused
// whatever its epoch, since its verifier is not the stored one.
const sessionVerifierMigration = `DROP TABLE agent_sessions;
	CREATE TABLE agent_session_verifiers (
		agent_id TEXT PRIMARY KEY,
		verifier BYTEA NOT NULL,
		epoch BIGINT NOT NULL,
		issued_at BIGINT NOT NULL
	);`
