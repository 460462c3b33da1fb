// Package runsbench measures runs end to end on loopback: a real broker
// (SQLite) and the agent's real run loop, executor, spool and uploader,
// talking gRPC. It holds only benchmarks; it lives apart because the
// broker and the agent may not import each other.
package runsbench
