package postgres

// groupsMigration (version 11) lets the broker find the runs of a run
// group (one submission, one run per region: gpupass runs --group, and
// the webhook sent when the group ends). The group is a column so that
// lookup is an index scan; it is also in the JSON body with the rest of
// the allocation. group_size is how many runs the group will hold: it
// has ended when that many have. Runs stored before it have an empty
// group, which is no group.
const groupsMigration = `ALTER TABLE allocs ADD COLUMN group_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE allocs ADD COLUMN group_size INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX allocs_group ON allocs(group_id, created_at);`

// groupCIMigration (version 14) holds the CI context of a run group: the
// forge, repository, pull or merge request and run that `gpupass train`
// submitted it from (broker-defined JSON, at most a few hundred bytes),
// sent in the group's webhook event. One row per group, set by the
// submission that started it; token_id is who set it.
const groupCIMigration = `CREATE TABLE group_ci (
		group_id TEXT PRIMARY KEY,
		token_id TEXT NOT NULL,
		body BYTEA NOT NULL,
		created_at BIGINT NOT NULL
	);`
