#!/usr/bin/env bash
# runs (issue 4), the agent half: measured with Go benchmarks in
# agent/executor and agent/spool, on loopback/local disk only.
# - events/s: a `yes`-like command printing 500,000 lines, through the
#   process runner, classifier and event encoding into a real spool
#   (process start to last record spooled). Peer, same run: the same
#   command with the shell redirecting its output to a file (the floor).
# - start -> first output line: Executor.Execute of `echo hello` until its
#   first stdout event is in the spool, p50/p95 over 200 runs. Peer, same
#   run: bare os/exec start to the first byte of output.
# - spool group commit: raw appends with an fsync per batch of 256.
# Prints markdown rows: | area | figure | value | goal | vs peer |
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go test -run '^$' -bench 'Chatty' -benchtime 3x ./agent/executor/ >"$tmp/chatty" 2>&1 || { cat "$tmp/chatty" >&2; exit 1; }
go test -run '^$' -bench 'FirstLine' -benchtime 200x ./agent/executor/ >"$tmp/first" 2>&1 || { cat "$tmp/first" >&2; exit 1; }
go test -run '^$' -bench 'Append/always' -benchtime 200000x ./agent/spool/ >"$tmp/spool" 2>&1 || { cat "$tmp/spool" >&2; exit 1; }
# metric NAME UNIT FILE: the value reported for UNIT on the line of NAME
metric() { awk -v n="$1" -v u="$2" '$1 ~ "^"n"(-[0-9]+)?$" { for (i = 2; i <= NF; i++) if ($i == u) print $(i-1) }' "$3"; }
ev="$(metric BenchmarkChattyEvents events/s "$tmp/chatty")"
evp="$(metric BenchmarkChattyPeer events/s "$tmp/chatty")"
p50="$(metric BenchmarkFirstLine p50-ms "$tmp/first")"
p95="$(metric BenchmarkFirstLine p95-ms "$tmp/first")"
pp50="$(metric BenchmarkFirstLinePeer p50-ms "$tmp/first")"
pp95="$(metric BenchmarkFirstLinePeer p95-ms "$tmp/first")"
sp="$(metric BenchmarkAppend/always/batch256 events/s "$tmp/spool")"
for v in "$ev" "$evp" "$p50" "$p95" "$pp50" "$pp95" "$sp"; do
	[ -n "$v" ] || { echo "45-runs: a benchmark reported nothing" >&2; cat "$tmp"/* >&2; exit 1; }
done
load="$(cut -d' ' -f1 /proc/loadavg)"
int() { awk -v a="$1" 'BEGIN { printf "%d", a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
echo "| runs | events/s, chatty command -> executor -> spool (agent half; load avg $load on $(nproc) cores) | $(int "$ev") | >= 50,000/s end to end | shell redirect to a file $(int "$evp")/s: $(ratio "$ev" "$evp") of it |"
echo "| runs | start -> first output line spooled, p50 (200 runs) | ${p50} ms | | bare fork/exec to first byte ${pp50} ms |"
echo "| runs | start -> first output line spooled, p95 (200 runs) | ${p95} ms | submit -> first line p95 < 150 ms (agent half) | bare fork/exec ${pp95} ms |"
echo "| runs | spool append, fsync per batch of 256 (group commit) | $(int "$sp") events/s | >= 50,000/s | |"
