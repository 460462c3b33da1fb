package postgres

// gangMigration (version 15) lets the broker find the ranks of a run
// across several nodes (store.Runs.GangAllocs): ranks 1.. carry rank 0's
// id in gang_id, which is empty on rank 0, on a one-node run and on every
// run stored before it. It is also in the JSON body with the rest of the
// allocation.
const gangMigration = `ALTER TABLE allocs ADD COLUMN gang_id TEXT NOT NULL DEFAULT '';
	CREATE INDEX allocs_gang ON allocs(gang_id);`
