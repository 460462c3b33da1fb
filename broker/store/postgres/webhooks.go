package postgres

// webhooksMigration (version 12) holds the webhook destinations an
// operator set up, one delivery per webhook and ended run group (the
// unique pair is what makes it once, across replicas), and each attempt.
// allocs_updated finds the groups that ended since the last look.
const webhooksMigration = `CREATE TABLE webhooks (
		id TEXT PRIMARY KEY,
		url TEXT NOT NULL,
		secret BYTEA NOT NULL,
		regions TEXT NOT NULL,
		created_at BIGINT NOT NULL
	);
	CREATE TABLE webhook_deliveries (
		id TEXT PRIMARY KEY,
		webhook_id TEXT NOT NULL,
		group_id TEXT NOT NULL,
		event TEXT NOT NULL,
		body BYTEA NOT NULL,
		state TEXT NOT NULL,
		attempts INTEGER NOT NULL DEFAULT 0,
		next_at BIGINT NOT NULL,
		created_at BIGINT NOT NULL,
		UNIQUE (webhook_id, group_id)
	);
	CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_at);
	CREATE TABLE webhook_attempts (
		delivery_id TEXT NOT NULL,
		n INTEGER NOT NULL,
		at BIGINT NOT NULL,
		status INTEGER NOT NULL,
		error TEXT NOT NULL,
		duration_ns BIGINT NOT NULL,
		PRIMARY KEY (delivery_id, n)
	);
	CREATE INDEX allocs_updated ON allocs(updated_at);`
