#!/usr/bin/env bash
# validate's cost: in-process per spec (Go benchmark) and a whole
# `gpupass validate` process (median of repeated runs). Goal: < 20 ms per
# process on a typical spec. Prints markdown rows for scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${BENCH_VALIDATE_RUNS:-50}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# In-process: ns/op of BenchmarkValidate per spec and of the fingerprint.
go test -run '^$' -bench 'BenchmarkValidate|BenchmarkFingerprint' -benchtime 2000x -count 1 ./internal/spec/ >"$tmp/bench.txt"
awk '/^Benchmark/ {
	name=$1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
	for (i=2; i<=NF; i++) if ($(i+1)=="ns/op") ns=$i
	printf "| validate | in-process %s | %.1f µs | — | — |\n", name, ns/1000
}' "$tmp/bench.txt"

# Whole process: build once, then time RUNS runs on the DESIGN example
# (fixed) spec; report the median and p90 wall time.
go build -trimpath -o "$tmp/gpupass" ./cmd/gpupass
spec=internal/spec/testdata/specs/design-example-fixed.yaml
"$tmp/gpupass" validate --spec "$spec" >/dev/null
for _ in $(seq "$RUNS"); do
	s=$(date +%s%N)
	"$tmp/gpupass" validate --spec "$spec" >/dev/null
	e=$(date +%s%N)
	echo $(( (e - s) / 1000 ))
done | sort -n >"$tmp/times.txt"
median=$(awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}' "$tmp/times.txt")
p90=$(awk '{a[NR]=$1} END {i=int(NR*0.9); if (i<1) i=1; print a[i]}' "$tmp/times.txt")
ok=$(awk -v m="$median" 'BEGIN {print (m < 20000) ? "met" : "MISSED"}')
awk -v n="$RUNS" -v m="$median" -v p="$p90" -v ok="$ok" 'BEGIN {
	printf "| validate | whole process, median of %d runs | %.1f ms (p90 %.1f ms) | < 20 ms (%s) | — |\n", n, m/1000, p/1000, ok
}'
