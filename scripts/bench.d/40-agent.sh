#!/usr/bin/env bash
# gpupass-agent figures: conformance suite wall time on a simulated
# profile (in-process cold and warm, and the whole `gpupass-agent check`
# process as a user runs it), and the size of the stripped agent binary
# (goal <= 15 MB, cgo on for NVML). Prints markdown rows for scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
RUNS="${BENCH_AGENT_RUNS:-15}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

go test -run '^$' -bench 'BenchmarkSuite' -benchtime 20x -count 1 ./internal/conformance/suite/ >"$tmp/bench.txt"
awk '/^BenchmarkSuite/ {
	name=$1; sub(/^BenchmarkSuite/, "", name); sub(/-[0-9]+$/, "", name)
	for (i=2; i<=NF; i++) if ($(i+1)=="ns/op") ns=$i
	what = (name == "Cold") ? "cold: every probe, 64 MiB read probe" : "warm: unchanged probes reused"
	printf "| agent | conformance suite wall time, h100-sxm5-8x simulated, in-process %s | %.1f ms | — | — |\n", what, ns/1e6
}' "$tmp/bench.txt"

CGO_ENABLED=1 go build -trimpath -ldflags '-s -w' -o "$tmp/gpupass-agent" ./cmd/gpupass-agent
size=$(stat -c %s "$tmp/gpupass-agent")
awk -v s="$size" 'BEGIN { printf "| agent | stripped gpupass-agent binary (cgo, -s -w, -trimpath) | %.1f MB (%.1f MiB) | <= 15 MB | — |\n", s/1e6, s/1048576 }'

# Whole process, as a user runs it: the suite_duration_ms the report
# carries (median), and the process wall time (median).
state="$tmp/state"
"$tmp/gpupass-agent" check --state-dir "$state" --simulate h100-sxm5-8x -o json >/dev/null
: >"$tmp/suite.txt"; : >"$tmp/wall.txt"
for _ in $(seq "$RUNS"); do
	s=$(date +%s%N)
	"$tmp/gpupass-agent" check --state-dir "$state" --storage-path "$tmp" --simulate h100-sxm5-8x -o json >"$tmp/out.json"
	e=$(date +%s%N)
	echo $(( (e - s) / 1000 )) >>"$tmp/wall.txt"
	grep -o '"suite_duration_ms":[0-9.]*' "$tmp/out.json" | cut -d: -f2 >>"$tmp/suite.txt"
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
printf "| agent | \`gpupass-agent check --simulate h100-sxm5-8x\`: suite wall time in the report (median of %d) | %.1f ms | — | — |\n" "$RUNS" "$(median "$tmp/suite.txt")"
printf "| agent | \`gpupass-agent check --simulate h100-sxm5-8x\`: whole process (median of %d; load %s) | %.1f ms | — | — |\n" "$RUNS" "$(cut -d' ' -f1 /proc/loadavg)" "$(awk '{print $1/1000}' <<<"$(median "$tmp/wall.txt")")"
