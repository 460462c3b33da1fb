#!/usr/bin/env bash
# One run across several nodes (issue #34): the peer figure its bench
# compares with, `srun -N2` of examples/ddp on the real two-node Slurm
# test cluster (internal/testutil/slurmtest, needs root, Slurm and
# python3-torch), submit -> the first output line of every rank. The
# gang placement is not built yet: its own figure, and the ratio (goal
# <= 1.25x), join this row when it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go test -tags e2e -run '^$' -bench 'BenchmarkDDPSrunFirstLine' -benchtime 10x -count 1 ./examples/ >"$tmp/bench.txt"
awk '/^BenchmarkDDPSrunFirstLine/ {
	for (i=2; i<=NF; i++) v[$(i+1)]=$i
	printf "| multi-node | submit -> first output line of every rank, srun -N2 of examples/ddp (the peer; gpupass gangs not placed yet) | p50 %.0f ms, p95 %.0f ms | gang <= 1.25x | n/a |\n", v["srun-p50-ms"], v["srun-p95-ms"]
}' "$tmp/bench.txt"
