#!/usr/bin/env bash
# Dashboard (broker/ui, issue #20): server time (p50, p95 over loopback)
# and page weight of the nodes and runs pages on a broker holding 10,000
# nodes and 10,000 runs: the first page and late ones, reached by the
# pages' "next" links (the API pages by token). Prints markdown rows for
# scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench 'BenchmarkDashboard' -benchtime "${BENCH_UI_CALLS:-50}x" -count 1 ./broker/ >"$out"
awk '
/^BenchmarkDashboard\// {
	split($1, p, "/"); page=p[2]; sub("-[0-9]+$", "", page)
	for (i = 2; i <= NF; i++) { if ($i == "p50-ms") p50=$(i-1); if ($i == "p95-ms") p95=$(i-1); if ($i == "page-KiB") kib=$(i-1) }
	printf "| dashboard | page %s, 10,000 nodes + 10,000 runs | p50 %.1f ms, p95 %.1f ms, %.0f KiB | n/a | n/a |\n", page, p50, p95, kib
}' "$out"
