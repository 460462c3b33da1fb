package postgres

// groupsMigration (version 11) lets the broker find the runs of a run
// group (one submission, one run per region: gpupass runs --group, and
// the webhook sent when the group ends). The group is a column so that
// lookup is an index scan; it is also in the JSON body with the rest of
// the allocation. Runs stored before it have no group (”).
const groupsMigration = `ALTER TABLE allocs ADD COLUMN group_id TEXT NOT NULL DEFAULT '';
	CREATE INDEX allocs_group ON allocs(group_id, created_at);`
