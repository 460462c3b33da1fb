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

# Whole process: build once, then time RUNS runs of `gpupass validate` on
# the DESIGN example (fixed) spec, and of `gpupass version` as the floor
# (process start + init, no work). Wall time is the goal's measure; CPU
# time (user+sys) is shown too because wall time on a loaded machine is
# mostly waiting for a core (load average printed alongside).
go build -trimpath -ldflags '-s -w' -o "$tmp/gpupass" ./cmd/gpupass
spec=internal/spec/testdata/specs/design-example-fixed.yaml
"$tmp/gpupass" validate --spec "$spec" >/dev/null
measure() { # measure OUTFILE CMD...: "real cpu" seconds per run
	local out="$1"; shift
	local TIMEFORMAT='%R %U %S'
	for _ in $(seq "$RUNS"); do
		{ time "$@" >/dev/null 2>&1; } 2>>"$out"
	done
}
measure "$tmp/validate.txt" "$tmp/gpupass" validate --spec "$spec"
measure "$tmp/version.txt" "$tmp/gpupass" version
# The floor of any Go program on this machine: a hello-world binary, so
# that the row separates gpupass's own start-up from the machine's.
mkdir "$tmp/hello"
printf 'package main\n\nimport "os"\n\nfunc main() { os.Stdout.WriteString("ok\\n") }\n' >"$tmp/hello/hello.go"
(cd "$tmp/hello" && go build -trimpath -ldflags '-s -w' -o hello hello.go)
measure "$tmp/hello.txt" "$tmp/hello/hello"
median() { # median of column expression over a file, in ms
	awk '{print ($2 == "" ? $1 : ('"$2"')) * 1000}' "$1" | sort -n |
		awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}
v_wall=$(median "$tmp/validate.txt" '$1'); v_cpu=$(median "$tmp/validate.txt" '$2+$3')
f_wall=$(median "$tmp/version.txt" '$1'); f_cpu=$(median "$tmp/version.txt" '$2+$3')
h_wall=$(median "$tmp/hello.txt" '$1')
load=$(cut -d' ' -f1 /proc/loadavg)
awk -v n="$RUNS" -v vw="$v_wall" -v vc="$v_cpu" -v fw="$f_wall" -v fc="$f_cpu" -v hw="$h_wall" -v load="$load" -v cores="$(nproc)" 'BEGIN {
	ok = (vw < 20) ? "met" : "MISSED"
	printf "| validate | whole process wall, median of %d runs (load %s on %s cores) | %.1f ms | < 20 ms (%s) | %.2fx `gpupass version` (%.1f ms); a hello-world Go binary %.1f ms |\n", n, load, cores, vw, ok, vw/fw, fw, hw
	printf "| validate | whole process CPU (user+sys), median | %.1f ms | — | %.2fx `gpupass version` (%.1f ms) |\n", vc, vc/fc, fc
}'
