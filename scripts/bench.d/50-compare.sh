#!/usr/bin/env bash
# compare-report (issue 5): 4 runs x 1,000,000 points each, end to end
# (read, align, render markdown + SVG + PNG + JSON + JUnit) with the built binary.
# Goal: < 1.5 s wall and < 300 MB peak RSS. Peer, same data, same run: a
# Python stdlib ETL script (json.loads per line, dict join on step, max
# |delta| per pair, no rendering) - what people write today.
# Prints markdown rows: | area | figure | value | goal | vs peer |
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v /usr/bin/time >/dev/null || { echo "50-compare: /usr/bin/time missing (make deps)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/gpupass" ./cmd/gpupass
for i in 1 2 3 4; do
	awk -v off="$i" 'BEGIN { t = 1772352000; for (s = 0; s < 1000000; s++)
		printf "{\"step\":%d,\"loss\":%.6f,\"ts\":%d}\n", s, 0.5 + 2 * exp(-s / 200000) + off * 0.001 + (s % 7) * 0.0001, t + s }' >"$tmp/r$i.jsonl"
done
runs=()
for r in 1 2 3; do
	/usr/bin/time -o "$tmp/t$r" -f "%e %U %S %M" "$tmp/gpupass" compare "$tmp"/r{1,2,3,4}.jsonl --post none \
		--svg "$tmp/c.svg" --png "$tmp/c.png" --junit "$tmp/c.xml" --json "$tmp/c.json" --markdown "$tmp/c.md" >/dev/null
	runs+=("$(cat "$tmp/t$r")")
done
grep -q "consistent" "$tmp/c.md" || { echo "50-compare: unexpected report" >&2; exit 1; }
# median by wall time
med="$(printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p)"
read -r wall user sys rss <<<"$med"
cpu="$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')"
rss_mb="$(awk -v k="$rss" 'BEGIN { printf "%.0f", k / 1024 }')"

cat >"$tmp/peer.py" <<'PY'
import json, sys, itertools
runs = []
for p in sys.argv[1:]:
    d = {}
    with open(p) as f:
        for line in f:
            o = json.loads(line)
            d[o["step"]] = o["loss"]
    runs.append(d)
for a, b in itertools.combinations(runs, 2):
    common = sorted(a.keys() & b.keys())
    print(max(abs(a[s] - b[s]) for s in common))
PY
/usr/bin/time -o "$tmp/tp" -f "%e %U %S %M" python3 "$tmp/peer.py" "$tmp"/r{1,2,3,4}.jsonl >/dev/null
read -r pwall puser psys prss <<<"$(cat "$tmp/tp")"
pcpu="$(awk -v u="$puser" -v s="$psys" 'BEGIN { printf "%.2f", u + s }')"
prss_mb="$(awk -v k="$prss" 'BEGIN { printf "%.0f", k / 1024 }')"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0) printf "%.1fx less", b / a; else print "n/a" }'; }
load="$(cut -d' ' -f1 /proc/loadavg)"
echo "| compare | 4x1M points end to end, wall (median of 3; load avg $load on $(nproc) cores) | ${wall} s | < 1.5 s | python json ETL ${pwall} s: $(ratio "$wall" "$pwall") |"
echo "| compare | 4x1M points end to end, CPU user+sys | ${cpu} s | | python ${pcpu} s: $(ratio "$cpu" "$pcpu") |"
echo "| compare | 4x1M points peak RSS | ${rss_mb} MB | < 300 MB | python ${prss_mb} MB: $(ratio "$rss_mb" "$prss_mb") |"
