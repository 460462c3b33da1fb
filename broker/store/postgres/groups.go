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
