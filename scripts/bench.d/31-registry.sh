#!/usr/bin/env bash
# A broker's first registry read (issue 21): Store.Nodes on a freshly
# opened store at 10,000 and 100,000 nodes, SQLite and PostgreSQL (a
# throwaway local cluster), wall time, CPU, bytes and allocations per read
# (Go benchmark BenchmarkNodes in broker/store/{sqlite,postgres}). Prints
# markdown rows for scripts/bench.sh; no goal in the issue (it was 7 s at
# 100,000 nodes, the broker's start-up).
#
# BENCH_REGISTRY_BASE: a git revision whose stores are measured in the same
#   run on the same generated registry, alternating with this tree's, for
#   a before/after figure (e.g. ee5b741, before the field-by-field index
#   decoding). The benchmark and its fixture are this tree's, dropped into
#   that revision.
# BENCH_REGISTRY_READS: reads per size and revision (default 5).
# The generated SQLite registries are kept in GPUPASS_BENCH_REGISTRY_DIR
# (default: gpupass-bench-registry in the temporary directory): the first
# run populates 100,000 nodes through the store, which takes minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE="${BENCH_REGISTRY_BASE:-}"
READS="${BENCH_REGISTRY_READS:-5}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

bench_files=(broker/store/storetest/bench.go broker/store/storetest/registry.go
	broker/store/sqlite/nodes_bench_test.go broker/store/postgres/nodes_bench_test.go)
build() { # build DIR NAME: test binaries of both stores
	(cd "$1" && go test -c -o "$tmp/$2-sqlite.test" ./broker/store/sqlite/ &&
		go test -c -o "$tmp/$2-postgres.test" ./broker/store/postgres/)
}
revs=(new)
build . new
if [ -n "$BASE" ]; then
	mkdir "$tmp/base"
	git archive "$BASE" | tar -x -C "$tmp/base"
	for f in "${bench_files[@]}"; do cp "$f" "$tmp/base/$f"; done
	build "$tmp/base" old
	revs=(old new)
fi
# Alternating revisions per store, so that a change of load weighs on both.
for st in sqlite postgres; do
	for rev in "${revs[@]}"; do
		(cd "$tmp" && "./$rev-$st.test" -test.run '^$' -test.bench 'BenchmarkNodes' -test.benchtime "${READS}x" -test.timeout 60m) |
			awk -v rev="$rev" -v st="$st" '/^BenchmarkNodes/ { print rev, st, $0 }' >>"$tmp/out.txt"
	done
done
awk -v base="$BASE" '
{
	rev=$1; st=$2; n=$3; sub(/.*nodes=/, "", n); sub(/-[0-9]+$/, "", n)
	for (i = 4; i <= NF; i++) {
		if ($i == "ns/op") ms=$(i-1)/1e6; if ($i == "cpu-ms/op") cpu=$(i-1); if ($i == "load1") load=$(i-1)
		if ($i == "B/op") mb=$(i-1)/1048576; if ($i == "allocs/op") al=$(i-1)
	}
	fig[rev, st, n] = sprintf("%.0f ms (CPU %.0f ms, %.0f MB, %.2fM allocs; load %s)", ms, cpu, mb, al/1e6, load)
	if (!((st, n) in seen)) { seen[st, n] = 1; order[++k] = st SUBSEP n }
}
END {
	for (j = 1; j <= k; j++) {
		split(order[j], p, SUBSEP)
		peer = ((("old", p[1], p[2]) in fig)) ? base ": " fig["old", p[1], p[2]] : "—"
		printf "| broker (%s) | first registry read (Store.Nodes), %s nodes | %s | — | %s |\n", p[1], p[2], fig["new", p[1], p[2]], peer
	}
}' "$tmp/out.txt"
