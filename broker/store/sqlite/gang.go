package sqlite

// gangMigration (version 15) holds what a run across several nodes
// needs. The broker finds the ranks of a gang (store.Runs.GangAllocs):
// ranks 1.. carry rank 0's id in gang_id, which is empty on rank 0, on a
// one-node run and on every run stored before it (it is also in the JSON
// body with the rest of the allocation). An agent's job_address and
// job_port_min..job_port_max are where its jobs can be reached
// (store.Labels.JobAddress): empty and 0 for agents enrolled before it,
// which take no gang rank until they enroll again.
const gangMigration = `ALTER TABLE allocs ADD COLUMN gang_id TEXT NOT NULL DEFAULT '';
	CREATE INDEX allocs_gang ON allocs(gang_id);
	ALTER TABLE agents ADD COLUMN job_address TEXT NOT NULL DEFAULT '';
	ALTER TABLE agents ADD COLUMN job_port_min INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE agents ADD COLUMN job_port_max INTEGER NOT NULL DEFAULT 0;`
