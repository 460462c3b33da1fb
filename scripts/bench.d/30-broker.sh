#!/usr/bin/env bash
# Broker figures (issue 3): dry-run latency p50/p95 with 1,000 and 10,000
# registered nodes, and heartbeats per second one broker sustains, on
# SQLite and PostgreSQL (a throwaway local cluster). Go benchmarks over a
# real broker on loopback; rows name the store. No peer tool to compare.
# Client and broker share the machine; each row also gives the process CPU
# per call, which other tenants of a shared machine do not inflate, and the
# machine's one-minute load when the row was measured.
# GPUPASS_BENCH_DRYRUN_BASE=<rev> also runs that revision's dry-run
# benchmarks (10,000 and 100,000 nodes, the views it has) just before
# this tree's, for old and new figures from one run; their rows say
# "base <rev>". Building it takes a minute; populating 100,000 nodes again
# takes minutes more.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mktemp)"
base_out="$(mktemp)"
base_dir=""
trap 'rm -f "$out" "$base_out"; [ -z "$base_dir" ] || rm -rf "$base_dir"' EXIT
base="${GPUPASS_BENCH_DRYRUN_BASE:-}"
# Dry-runs: 400 calls per case (p95 over 400) at 1,000 and 10,000 nodes,
# 40 at 100,000 (GPUPASS_BENCH_DRYRUN_100K=0 skips those: populating
# 100,000 nodes takes minutes); heartbeats: 20,000 beats.
big=true
[ "${GPUPASS_BENCH_DRYRUN_100K:-1}" = 0 ] && big=false
if [ -n "$base" ]; then
	base_dir="$(mktemp -d)"
	git archive "$base" | tar -x -C "$base_dir"
	if ! (cd "$base_dir" && go test -c -o broker.test ./broker/ &&
		cd broker && ../broker.test -test.run '^$' -test.bench 'BenchmarkDryRun/store=.*/nodes=10000$/(columns|inline|summary)$' -test.benchtime 200x -test.timeout 40m &&
		{ ! $big || ../broker.test -test.run '^$' -test.bench 'BenchmarkDryRun/store=.*/nodes=100000$/(columns|inline|summary)$' -test.benchtime 40x -test.timeout 40m; }) >"$base_out" 2>&1; then
		grep -A3 -- '--- FAIL' "$base_out" >&2 || tail -20 "$base_out" >&2
		echo "| broker | dry-run latency, base $base | FAILED (see stderr) | | n/a |"
	fi
fi
if ! go test -run '^$' -bench 'BenchmarkDryRun/store=.*/nodes=(1000|10000)$' -benchtime 400x -timeout 40m ./broker/ >"$out" 2>&1 ||
	! go test -run '^$' -bench 'BenchmarkHeartbeats' -benchtime 20000x -timeout 20m ./broker/ >>"$out" 2>&1; then
	cat "$out" >&2
	exit 1
fi
# 100,000 nodes on its own: on a crowded machine a call there can outlast
# the client's 30 s timeout, which should cost its rows, not the others.
if $big && ! go test -run '^$' -bench 'BenchmarkDryRun/store=.*/nodes=100000$/(columns|inline|summary|all)$' -benchtime 40x -timeout 40m ./broker/ >>"$out" 2>&1; then
	grep -A3 -- '--- FAIL' "$out" >&2 || true
	echo "| broker | dry-run latency, 100000 nodes | FAILED (see stderr) | p95 < 100 ms | n/a |"
fi
rows() {
	awk -v base="$1" '
/--- FAIL/ { next }
/^BenchmarkDryRun\// {
	split($1, p, "/"); store=p[2]; sub("store=", "", store); nodes=p[3]; sub("nodes=", "", nodes); mode=p[4]; sub("-[0-9]+$", "", mode)
	for (i = 2; i <= NF; i++) { if ($i == "p50-ms") p50=$(i-1); if ($i == "p95-ms") p95=$(i-1); if ($i == "cpu-ms/op") cpu=$(i-1) }
	load = "n/a"
	for (i = 2; i <= NF; i++) { if ($i == "answer-bytes") bytes=$(i-1); if ($i == "load1") load=$(i-1) }
	goal = (nodes == "10000" && mode != "uncached" && mode != "expanded" && mode != "all") ? "p95 < 20 ms" : (nodes == "100000" && mode != "all") ? "p95 < 100 ms" : ""
	what = (mode == "columns") ? "CLI view (columns)" : (mode == "inline") ? "inline view (API default: reasons by reference, nodes in short form)" : (mode == "expanded") ? "inline view, every reason written out and candidates in full (INLINE_EXPANDED, the old default)" : (mode == "summary") ? "summary view (--excluded summary, candidates in short form)" : (mode == "all") ? "CLI view with --all (every node listed)" : "columns view, registry re-read every call"
	if (base != "") { what = what ", base " base; goal = "" }
	else if (mode != "all") { what = what ", 100 of each listed" }
	printf "| broker (%s) | dry-run latency, %s nodes, %s | p50 %.2f ms, p95 %.2f ms (CPU %.1f ms/call, client included; answer %.0f KB; load %s) | %s | n/a |\n", store, nodes, what, p50, p95, cpu, bytes/1024, load, goal
}
/^BenchmarkHeartbeats\// {
	split($1, p, "/"); store=p[2]; sub("store=", "", store); sub("-[0-9]+$", "", store)
	first=""
	for (i = 2; i <= NF; i++) { if ($i == "beats/s") v=$(i-1); if ($i == "cpu-us/beat") cpu=$(i-1); if ($i == "first-beats/s") first=$(i-1) }
	firstnote = first == "" ? "" : sprintf("; each node'"'"'s first beat, key shown: %.0f/s", first)
	printf "| broker (%s) | heartbeats/s, one broker, 64 gRPC agents, after first contact | %.0f/s (CPU %.0f us/beat, client included%s) | >= 5,000/s | n/a |\n", store, v, cpu, firstnote
}'
}
[ -z "$base" ] || rows "$base" <"$base_out"
rows "" <"$out"
