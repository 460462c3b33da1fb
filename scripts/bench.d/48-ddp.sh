#!/usr/bin/env bash
# One run across several nodes (issue #34): submit -> the first output
# line of every rank, examples/ddp as a gang of two nodes, gpupass against
# its peer `srun -N2` of the same script on the real two-node Slurm test
# cluster (internal/testutil/slurmtest, needs root, Slurm and
# python3-torch), alternated round by round in one run.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# gang_rows BENCH PACKAGE WHAT runs the Go benchmark BENCH of PACKAGE
# (10 rounds of gpupass and srun -N2, alternated) and prints its rows:
# submit -> first output line of every rank, p50 and p95 against srun,
# with the load average it ran under, and where gpupass's time goes for
# the figures the benchmark reports.
gang_rows() {
	local bench="$1" pkg="$2" what="$3" out="$tmp/$1.txt"
	go test -tags e2e -run '^$' -bench "^$bench\$" -benchtime 10x -count 1 "$pkg" >"$out" 2>&1 || { cat "$out" >&2; return 1; }
	awk -v bench="$bench" -v what="$what" -v load="$(cut -d' ' -f1 /proc/loadavg)" -v cores="$(nproc)" '$1 ~ "^" bench {
		for (i=2; i<=NF; i++) v[$(i+1)]=$i
		printf "| multi-node | submit -> first output line of every rank, p50: %s vs srun -N2 (10 rounds each, alternated; load avg %s on %s cores) | %.0f ms vs %.0f ms | <= 1.25x | %.2fx |\n", what, load, cores, v["gpupass-p50-ms"], v["srun-p50-ms"], v["gpupass-p50-ms"]/v["srun-p50-ms"]
		printf "| multi-node | submit -> first output line of every rank, p95 (as above) | %.0f ms vs %.0f ms | <= 1.25x | %.2fx |\n", v["gpupass-p95-ms"], v["srun-p95-ms"], v["gpupass-p95-ms"]/v["srun-p95-ms"]
		if ("slurm-sbatch-p50-ms" in v) {
			printf "| multi-node | of which Slurm alone, p50: sbatch -N2 of a script whose srun starts a task a node doing nothing -> every task started, vs srun -N2 of that task (10 rounds each, alternated, each from a random phase of the pass in which slurmctld starts batch jobs, once a second; the gang is a batch job so that it outlives the agent) | %.0f ms vs %.0f ms | | +%.0f ms |\n", v["slurm-sbatch-p50-ms"], v["slurm-srun-p50-ms"], v["slurm-sbatch-p50-ms"]-v["slurm-srun-p50-ms"]
			printf "| multi-node | of which Slurm alone, p95 (as above) | %.0f ms vs %.0f ms | | +%.0f ms |\n", v["slurm-sbatch-p95-ms"], v["slurm-srun-p95-ms"], v["slurm-sbatch-p95-ms"]-v["slurm-srun-p95-ms"]
		}
		if ("gpupass-started-p50-ms" in v) {
			printf "| multi-node | where gpupass time goes, p50: train printed the submitted run / every rank process started (of which the link measurement by the agents themselves: an all-reduce of 32 MiB, once to connect and 5 times timed) / the job starting (python imports torch, in srun too) | %.0f ms / %.0f ms (%.0f ms) / %.0f ms | | |\n", v["gpupass-submitted-p50-ms"], v["gpupass-started-p50-ms"], v["gpupass-link-p50-ms"], v["gpupass-job-p50-ms"]
			printf "| multi-node | where gpupass time goes, p95: every rank process started / the job starting | %.0f ms / %.0f ms | | |\n", v["gpupass-started-p95-ms"], v["gpupass-job-p95-ms"]
		}
	}' "$out"
}

# gpupass's gang on local agents (`gpupass up --agents-per-region 2`,
# `gpupass train --follow` of resources.nodes: 2) against srun -N2.
gang_rows BenchmarkDDPGangFirstLine ./examples/ "gpupass train --follow of examples/ddp, nodes: 2 on two local agents"

# A gpupass gang on Slurm (issue #34): `gpupass train` of a 2-node spec on
# `gpupass up --executor slurm` over a test cluster of two nodes with the
# same GRES (agent/executor/slurm/gange2e: the broker places the gang, the
# agent submits one sbatch -N2 job), submit -> the first line of every rank
# in its log, alternated in one run with srun -N2 of the same script,
# every round from a random phase of slurmctld's once-a-second pass.
gang_rows BenchmarkE2ESlurmGangFirstLine ./agent/executor/slurm/gange2e/ "gpupass Slurm gang of examples/ddp"
