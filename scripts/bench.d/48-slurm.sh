#!/usr/bin/env bash
# Slurm executor (issue #18): submit -> first output line through the
# agent's Slurm runner against sbatch + reading the output file directly,
# on the real two-node test cluster (internal/testutil/slurmtest, needs
# root and scripts/setup.d/60-slurm.sh), same poll interval, alternated in
# one run. Goal: gpupass adds under 20% to what Slurm itself takes.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go test -run '^$' -bench 'BenchmarkSubmitToFirstLine' -benchtime 20x -count 1 ./agent/executor/slurm/ >"$tmp/bench.txt"
awk '/^BenchmarkSubmitToFirstLine/ {
	for (i=2; i<=NF; i++) v[$(i+1)]=$i
	printf "| slurm | submit -> first output line, p50 (gpupass runner vs sbatch + reading the file) | %.0f ms vs %.0f ms | < 1.2x | %.2fx |\n", v["gpupass-p50-ms"], v["sbatch-p50-ms"], v["gpupass-p50-ms"]/v["sbatch-p50-ms"]
	printf "| slurm | submit -> first output line, p95 (gpupass runner vs sbatch + reading the file) | %.0f ms vs %.0f ms | < 1.2x | %.2fx |\n", v["gpupass-p95-ms"], v["sbatch-p95-ms"], v["gpupass-p95-ms"]/v["sbatch-p95-ms"]
}' "$tmp/bench.txt"
