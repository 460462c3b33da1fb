// Package agent is the daemon on every GPU node: probes, conformance
// runner, executor, spool and uploader. It never imports the broker, and
// stays small (no cosign, no forge clients).
package agent
