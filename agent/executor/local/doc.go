// Package local is the local executor's machinery (--executor local): the
// Runner that starts a run's attempts as process groups on this node
// (ProcessRunner) and the RunHost that holds each run there (Host: its
// cgroup, its own uid from a --run-as-range, its own /tmp, /var/tmp and
// /dev/shm), so that nothing a job started outlives its run.
//
// It implements agent/executor's contract and imports it; agent/executor
// imports nothing of it (internal/depcheck).
package local
