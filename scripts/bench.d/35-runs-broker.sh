#!/usr/bin/env bash
# Runs on the broker (issue 4): events per second stored through
# UploadRecords (gRPC on loopback, batches of 2048 as the agent's uploader
# sends them, each acknowledged before the next) on SQLite and PostgreSQL,
# and Submit -> the agent's long poll holding the assignment, p50/p95 over
# 200 runs, with no webhook and with one whose endpoint hangs (issue 35).
# Go benchmarks over a real broker; no peer tool to compare.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
if ! go test -run '^$' -bench 'BenchmarkRecordIngest' -benchtime 200000x -timeout 20m ./broker/ >"$out" 2>&1 ||
	! go test -run '^$' -bench 'BenchmarkSubmitToAssignment' -benchtime 200x -timeout 10m ./broker/ >>"$out" 2>&1; then
	cat "$out" >&2
	exit 1
fi
awk '
/^BenchmarkRecordIngest\// {
	split($1, p, "/"); store=p[2]; sub("store=", "", store); agents=p[3]; sub("agents=", "", agents); sub("-[0-9]+$", "", agents)
	for (i = 2; i <= NF; i++) if ($i == "events/s") v=$(i-1)
	goal = (store == "sqlite") ? ">= 50,000/s" : ""
	printf "| runs broker (%s) | events/s stored via UploadRecords, %s agent(s), 200,000 events each (capacity: per-run rate limit off) | %.0f/s | %s | n/a |\n", store, agents, v, goal
}
/^BenchmarkSubmitToAssignment\// {
	split($1, p, "/"); hook=p[2]; sub("webhook=", "", hook); sub("-[0-9]+$", "", hook)
	for (i = 2; i <= NF; i++) { if ($i == "p50-ms") p50=$(i-1); if ($i == "p95-ms") p95=$(i-1) }
	what = (hook == "hanging") ? ", a webhook endpoint hanging every attempt (issue 35)" : ""
	printf "| runs broker (sqlite) | submit -> assignment at the agent long poll, 200 runs%s | p50 %.2f ms, p95 %.2f ms | part of p95 < 150 ms to first line | n/a |\n", what, p50, p95
}' "$out"
