#!/usr/bin/env bash
# Cost of one Prometheus scrape of the broker's /metrics (issue 20) with
# 10,000 registered nodes, on SQLite and PostgreSQL: wall time per scrape
# (p50, p95), process CPU per scrape (client included; other tenants of a
# shared machine do not inflate it), and bytes (gzip on the wire, as
# Prometheus asks, and the exposition itself). No peer tool to compare.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
if ! go test -run '^$' -bench 'BenchmarkMetricsScrape' -benchtime 300x -timeout 30m ./broker/ >"$out" 2>&1; then
	cat "$out" >&2
	exit 1
fi
awk '
/^BenchmarkMetricsScrape\// {
	split($1, p, "/"); store=p[2]; sub("store=", "", store)
	for (i = 2; i <= NF; i++) {
		if ($i == "p50-ms") p50=$(i-1); if ($i == "p95-ms") p95=$(i-1); if ($i == "cpu-ms/op") cpu=$(i-1)
		if ($i == "wire-bytes") wire=$(i-1); if ($i == "exposition-bytes") raw=$(i-1)
	}
	printf "| broker (%s) | one /metrics scrape, 10,000 nodes (gzip, token) | p50 %.2f ms, p95 %.2f ms (CPU %.1f ms/scrape, client included); %.1f KB on the wire, %.1f KB exposition | — | n/a |\n", store, p50, p95, cpu, wire/1024, raw/1024
}' "$out"
