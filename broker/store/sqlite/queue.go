package sqlite

// queueMigration (version 13) lets the broker read a region's queue: the
// pending runs waiting for a busy node, in the order they began waiting
// (store.Runs.QueuedAllocs; gpupass runs' queue position, placement
// first come first placed). queued_at is 0 for a run not waiting, which
// every run stored before it is until the broker next places it; it is
// also in the JSON body with the rest of the allocation.
const queueMigration = `ALTER TABLE allocs ADD COLUMN queued_at BIGINT NOT NULL DEFAULT 0;
	CREATE INDEX allocs_queue ON allocs(region, state, queued_at, id);`
