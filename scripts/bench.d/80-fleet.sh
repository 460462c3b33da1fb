#!/usr/bin/env bash
# Fleet figures (issue 21): three gpupass-broker processes on one
# PostgreSQL (a throwaway local cluster) and internal/loadgen's simulated
# fleet spread over them, in one Go benchmark (internal/loadgen
# BenchmarkFleet). Scale knob GPUPASS_BENCH_FLEET_SCALE (default 0.05,
# 1 = the goal): 20,000·s agents beating every 10·s seconds keeps the
# goal's 2,000 beats/s over 3 brokers on a registry s times the size;
# max(1, 200·s) runs keep 100 lines/s each (s times the line rate) and
# write 10 metric points/s each to their metrics file. The
# kill -9 row (agents fail over through the client's URL list) is left out
# with GPUPASS_BENCH_FLEET_FAILOVER=0. Load and the simulated fleet share this
# machine with the brokers and PostgreSQL: the load average is printed, and
# how many cores each side used while under load (read from /proc).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
scale="${GPUPASS_BENCH_FLEET_SCALE:-0.05}"
GPUPASS_BENCH_FLEET_SCALE="$scale" go test -run '^$' -bench 'BenchmarkFleet' -benchtime 1x -timeout 30m ./internal/loadgen/ >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
# Why any run failed (its lines count as lost), for whoever reads stderr.
grep -o 'RunsFailed:\[[^]]*[^ ]\]' "$out" | grep -v 'RunsFailed:\[\]' >&2 || true
load="$(cut -d' ' -f1 /proc/loadavg)"
awk -v scale="$scale" -v load="$load" -v cores="$(nproc)" '
function m(u,   i) { for (i = 2; i <= NF; i++) if ($i == u) return $(i-1); return "" }
/^BenchmarkFleet\/steady/ {
	printf "| fleet | agents held by 3 brokers on one PostgreSQL, scale %s: %d agents beating every %.1f s (load %s on %s cores) | %.0f beats/s; while the runs stream p50 %.1f ms, p99 %.1f ms (of which the brokers'"'"' handling: p99 %.1f ms); over the whole 30 s p50 %.1f ms, p99 %.1f ms; %d errors, longest silence %.1f s | 20,000 agents at 10 s (2,000 beats/s), p99 < 50 ms | n/a |\n", scale, m("agents"), m("beat-every-s"), load, cores, m("beats/s"), m("hb-streaming-p50-ms"), m("hb-streaming-p99-ms"), m("hb-broker-p99-ms"), m("hb-p50-ms"), m("hb-p99-ms"), m("hb-errors"), m("max-beat-gap-s")
	printf "| fleet | streaming runs, scale %s: %d runs x 100 lines/s + 10 metric points/s (load %s) | %.0f lines/s stored, %d lost (including the unprinted lines of failed runs), %d duplicated, %d runs failed; metric points %d stored, %d lost, %d duplicated; line to following client p50 %.0f ms, p99 %.0f ms | 200 runs x 100 lines/s, 0 lost, p99 < 1 s | n/a |\n", scale, m("runs"), load, m("lines/s"), m("lost"), m("dup"), m("runs-failed"), m("points"), m("points-lost"), m("points-dup"), m("line-p50-ms"), m("line-p99-ms")
	printf "| fleet | dry-run under that load, %d nodes, inline view | p95 %.1f ms | | n/a |\n", m("agents"), m("dryrun-p95-ms")
	printf "| fleet | CPU while under that load, scale %s (from the runs'"'"' submission to the end of the heartbeat window) | 3 brokers %.2f cores, PostgreSQL %.2f, load generator and its emitters %.2f, of %s | | n/a |\n", scale, m("broker-cores"), m("pg-cores"), m("gen-cores"), cores
}
/^BenchmarkFleet\/kill9/ {
	killed = 1
	printf "| fleet | kill -9 of one of 3 brokers under that load, scale %s (load %s) | agents heard again within %.1f s (longest silence, beat every %.1f s), %d beats failed; lines %d lost, %d duplicated, %d runs failed, slowest line %.1f s | < 15 s, 0 lost or duplicated | n/a |\n", scale, load, m("max-beat-gap-s"), m("beat-every-s"), m("hb-errors"), m("lost"), m("dup"), m("runs-failed"), m("line-max-ms")/1000
}
END { if (!killed) print "| fleet | kill -9 of one of 3 brokers under that load | not run (GPUPASS_BENCH_FLEET_FAILOVER=0) | < 15 s, 0 lost or duplicated | n/a |" }
' "$out"
