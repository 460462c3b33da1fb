#!/usr/bin/env bash
# validate's cost: in-process per spec (Go benchmark) and a whole
# `gpupass validate` process (median of repeated runs). Goal: < 20 ms per
# process on a typical spec. Prints markdown rows for scripts/bench.sh.
#
# BENCH_VALIDATE_RUNS: starts per binary (default 200).
# BENCH_VALIDATE_BASE: a git revision whose gpupass is timed in the same
#   run, interleaved, for a before/after figure (e.g. ee5b741, the last
#   commit before the lazy command tree and the hand-written spec
#   parsers).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${BENCH_VALIDATE_RUNS:-200}"
BASE="${BENCH_VALIDATE_BASE:-}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# In-process: ns/op of BenchmarkValidate per spec and of the fingerprint.
go test -run '^$' -bench 'BenchmarkValidate|BenchmarkFingerprint' -benchtime 2000x -count 1 ./internal/spec/ >"$tmp/bench.txt"
awk '/^Benchmark/ {
	name=$1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
	for (i=2; i<=NF; i++) if ($(i+1)=="ns/op") ns=$i
	printf "| validate | in-process %s | %.1f µs | — | — |\n", name, ns/1000
}' "$tmp/bench.txt"

# Whole process: build once (as a release does: -trimpath -s -w), then
# time RUNS starts of each program, interleaved so that a change of load
# weighs on all alike: `gpupass validate` on the DESIGN example (fixed)
# spec, `gpupass version` (process start + init, no work), a hello-world
# Go binary (the floor of any Go program on this machine), and the base
# revision's `gpupass validate` when BENCH_VALIDATE_BASE is set. Wall time
# is the goal's measure; CPU time (user+sys) is shown too because wall
# time on a loaded machine is mostly waiting for a core (the load average
# is printed alongside, before and after).
build() { (cd "$1" && go build -trimpath -ldflags '-s -w' -o "$2" "$3"); }
build . "$tmp/gpupass" ./cmd/gpupass
spec=internal/spec/testdata/specs/design-example-fixed.yaml
mkdir "$tmp/hello"
printf 'package main\n\nimport "os"\n\nfunc main() { os.Stdout.WriteString("ok\\n") }\n' >"$tmp/hello/hello.go"
(cd "$tmp/hello" && go mod init hello >/dev/null 2>&1 && go build -trimpath -ldflags '-s -w' -o hello .)
names=(validate version hello)
cmds=("$tmp/gpupass validate --spec $spec" "$tmp/gpupass version" "$tmp/hello/hello")
if [ -n "$BASE" ]; then
	mkdir "$tmp/base"
	git archive "$BASE" | tar -x -C "$tmp/base"
	build "$tmp/base" "$tmp/gpupass-base" ./cmd/gpupass
	names+=(base)
	cmds+=("$tmp/gpupass-base validate --spec $spec")
fi
for c in "${cmds[@]}"; do $c >/dev/null 2>&1 || { echo "bench: $c failed" >&2; exit 1; }; done
load_before=$(cut -d' ' -f1 /proc/loadavg)
TIMEFORMAT='%3R %3U %3S'
for _ in $(seq "$RUNS"); do
	for i in "${!cmds[@]}"; do
		# shellcheck disable=SC2086 # the command line splits into words
		{ time ${cmds[$i]} >/dev/null 2>&1; } 2>>"$tmp/${names[$i]}.txt"
	done
done
load_after=$(cut -d' ' -f1 /proc/loadavg)
median() { # median of an awk expression over a file of "real user sys", in ms
	awk '{print ('"$2"') * 1000}' "$1" | sort -n |
		awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}
declare -A wall cpu
# shellcheck disable=SC2016 # awk expressions, expanded by awk
for n in "${names[@]}"; do
	wall[$n]=$(median "$tmp/$n.txt" '$1')
	cpu[$n]=$(median "$tmp/$n.txt" '$2+$3')
done
size=$(stat -c %s "$tmp/gpupass")
base_note=""
if [ -n "$BASE" ]; then
	base_note=$(awk -v b="${wall[base]}" -v bc="${cpu[base]}" -v s="$(stat -c %s "$tmp/gpupass-base")" -v r="$BASE" \
		'BEGIN {printf "; gpupass at %s %.1f ms wall, %.1f ms CPU, %.1f MB", r, b, bc, s/1e6}')
fi
awk -v n="$RUNS" -v vw="${wall[validate]}" -v vc="${cpu[validate]}" -v fw="${wall[version]}" -v fc="${cpu[version]}" \
	-v hw="${wall[hello]}" -v hc="${cpu[hello]}" -v l1="$load_before" -v l2="$load_after" -v cores="$(nproc)" \
	-v size="$size" -v base="$base_note" 'BEGIN {
	ok = (vw < 20) ? "met" : "MISSED"
	printf "| validate | whole process wall, median of %d starts (load %s→%s on %s cores; binary %.1f MB) | %.1f ms | < 20 ms (%s) | %.2fx `gpupass version` (%.1f ms); a hello-world Go binary %.1f ms%s |\n", n, l1, l2, cores, size/1e6, vw, ok, vw/fw, fw, hw, base
	printf "| validate | whole process CPU (user+sys), median | %.1f ms | — | %.2fx `gpupass version` (%.1f ms); hello-world %.1f ms |\n", vc, vc/fc, fc, hc
}'

# Page faults per start, when perf is installed: on a VM a process's CPU
# time follows them (most are anonymous memory the runtime, the package
# inits and the command touch), and unlike times they hardly move with
# the load.
if command -v perf >/dev/null 2>&1; then
	declare -A faults
	for i in "${!cmds[@]}"; do
		# shellcheck disable=SC2086 # the command line splits into words
		faults[${names[$i]}]=$(perf stat -x, -r 50 -e page-faults ${cmds[$i]} 2>&1 >/dev/null | awk -F, '/page-faults/ {print $1; exit}')
	done
	base_faults=""
	if [ -n "$BASE" ]; then
		base_faults="; gpupass at $BASE ${faults[base]}"
	fi
	echo "| validate | page faults per start (perf stat, mean of 50) | ${faults[validate]} | — | \`gpupass version\` ${faults[version]}; hello-world ${faults[hello]}$base_faults |"
fi
