#!/usr/bin/env bash
# make bench: runs every scripts/bench.d/*.sh and prints one table.
# Each part prints markdown rows: | area | figure | value | goal | peer ratio |
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
export CGO_CFLAGS=-Wno-deprecated-declarations
echo "gpupass benchmarks — $(date -u +%Y-%m-%dT%H:%M:%SZ) — $(nproc) cores, $(go version | awk '{print $3}')"
echo
echo "| area | figure | value | goal | vs peer (same run) |"
echo "|---|---|---|---|---|"
for f in scripts/bench.d/*.sh; do
	[ -e "$f" ] || continue
	bash "$f" || echo "| $(basename "$f" .sh) | FAILED (see stderr) | | | |"
done
