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

# A gpupass gang on Slurm (issue #34): `gpupass train` of a 2-node spec on
# `gpupass up --executor slurm` over a test cluster of two nodes with the
# same GRES (agent/executor/slurm/gange2e: the broker places the gang, the
# agent submits one sbatch -N2 job), submit -> the first line of every rank
# in its log, alternated in one run with srun -N2 of the same script.
slurm_gang() {
	go test -tags e2e -run '^$' -bench 'BenchmarkE2ESlurmGangFirstLine' -benchtime 10x -count 1 ./agent/executor/slurm/gange2e/ >"$tmp/gang.txt"
	awk '/^BenchmarkE2ESlurmGangFirstLine/ {
		for (i=2; i<=NF; i++) v[$(i+1)]=$i
		printf "| multi-node | submit -> first output line of every rank, p50 (gpupass Slurm gang vs srun -N2 of examples/ddp) | %.0f ms vs %.0f ms | <= 1.25x | %.2fx |\n", v["gpupass-p50-ms"], v["srun-p50-ms"], v["gpupass-p50-ms"]/v["srun-p50-ms"]
		printf "| multi-node | submit -> first output line of every rank, p95 (gpupass Slurm gang vs srun -N2 of examples/ddp) | %.0f ms vs %.0f ms | <= 1.25x | %.2fx |\n", v["gpupass-p95-ms"], v["srun-p95-ms"], v["gpupass-p95-ms"]/v["srun-p95-ms"]
	}' "$tmp/gang.txt"
}
slurm_gang
