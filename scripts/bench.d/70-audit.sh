#!/usr/bin/env bash
# Audit reports (issue 7): build + sign + verify of a run with 100,000
# metric points, and gpupass signing vs `cosign sign-blob` of the same
# manifest, both measured as processes in this run (median of N).
# Prints markdown rows: | area | figure | value | goal | vs peer |
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${AUDIT_BENCH_RUNS:-15}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# In-process Go benchmarks (key already decrypted).
gobench="$(go test ./internal/audit -run '^$' -bench 'BenchmarkAudit|BenchmarkSignManifest' -benchtime 1s 2>&1)" || {
	echo "$gobench" >&2
	exit 1
}
ns() { awk -v n="$1" '$1 ~ n {print $3}' <<<"$gobench" | head -1; }
ms() { awk -v v="$1" 'BEGIN{printf "%.1f ms", v/1e6}'; }
echo "| audit | build+sign+verify, 100k metric points (in process) | $(ms "$(ns 'build\+sign\+verify/100k')") | — | — |"
echo "| audit | build+sign, 100k metric points (in process) | $(ms "$(ns 'build\+sign/100k')") | — | — |"
echo "| audit | verify, 100k metric points (in process) | $(ms "$(ns 'verify/100k')") | < 5 min for an auditor | — |"
echo "| audit | sign manifest, key decrypted (in process) | $(awk -v v="$(ns BenchmarkSignManifest)" 'BEGIN{printf "%.0f µs", v/1e3}') | — | — |"

# Through the broker, as `gpupass audit ALLOC` does it: GetRunEvidence +
# GetMetrics of a finished run with 100k points from a real broker on
# SQLite, build, sign, verify (key decryption excluded).
brbench="$(go test ./internal/command/gpupass/auditcmd -run '^$' -bench 'BenchmarkAuditFromBroker' -benchtime 5x 2>&1)" || {
	echo "$brbench" >&2
	exit 1
}
echo "| audit | from the broker: evidence + 100k metric points + build+sign+verify (in process) | $(ms "$(awk '$1 ~ /BenchmarkAuditFromBroker/ {print $3}' <<<"$brbench" | head -1)") | — | — |"

# Processes: the real binaries, the same key and manifest.
go build -o "$work/" ./cmd/gpupass
cp internal/audit/testdata/{run.json,cosign.pub,agent.pub} "$work/"
install -m 0600 internal/audit/testdata/cosign.key "$work/cosign.key"
python3 - "$work/run.json" "$work/run100k.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
names = ["loss", "lr", "grad_norm", "tokens_per_s"]
r["metrics"] = [{"name": names[i % 4], "step": i // 4, "value": 1.0 / (i // 4 + 1),
                 "time": "2026-11-29T10:00:05Z"} for i in range(100_000)]
json.dump(r, open(sys.argv[2], "w"))
PY
export COSIGN_PASSWORD=gpupass-test TUF_ROOT="$work/tuf" HOME="$work" COSIGN_YES=true
cd "$work"
./gpupass audit alloc-7f3a --run-file run.json --key cosign.key --out small.zip >/dev/null 2>&1
python3 -c 'import zipfile; open("manifest.json","wb").write(zipfile.ZipFile("small.zip").read("manifest.json"))'

if ! command -v cosign >/dev/null; then
	echo "| audit | gpupass vs cosign sign-blob | cosign not installed (make deps) | | |"
	exit 0
fi

# median wall time in ms of N runs of a command
python3 - "$N" <<'PY'
import statistics, subprocess, sys, time
n = int(sys.argv[1])
def median_ms(cmd):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ts.append((time.perf_counter() - t) * 1000)
    return statistics.median(ts)
gp_sign = median_ms(["./gpupass", "audit", "alloc-7f3a", "--run-file", "run.json", "--key", "cosign.key", "--out", "a.zip"])
co_sign = median_ms(["cosign", "sign-blob", "--key", "cosign.key", "--bundle", "c.json", "--new-bundle-format",
                     "--tlog-upload=false", "manifest.json"])
gp_big = median_ms(["./gpupass", "audit", "alloc-7f3a", "--run-file", "run100k.json", "--key", "cosign.key", "--out", "big.zip"])
gp_verify = median_ms(["./gpupass", "audit", "verify", "big.zip", "--key", "cosign.pub", "--agent-key", "agent.pub"])
co_verify = median_ms(["sh", "-c", "python3 -c 'import zipfile,sys; z=zipfile.ZipFile(\"big.zip\"); [open(n,\"wb\").write(z.read(n)) for n in (\"manifest.json\",\"manifest.sigstore.json\")]' && "
                       "echo '{\"mediaType\":\"application/vnd.dev.sigstore.trustedroot+json;version=0.1\"}' > tr.json && "
                       "cosign verify-blob --key cosign.pub --bundle manifest.sigstore.json --trusted-root tr.json --insecure-ignore-tlog manifest.json"])
print(f"| audit | `gpupass audit` process: build+sign a report (median of {n}) | {gp_sign:.0f} ms | — | {gp_sign/co_sign:.2f}× `cosign sign-blob` of the same manifest ({co_sign:.0f} ms) |")
print(f"| audit | `gpupass audit` process, 100k metric points (median of {n}) | {gp_big:.0f} ms | — | {gp_big/co_sign:.2f}× `cosign sign-blob` |")
print(f"| audit | `gpupass audit verify` process, all layers, 100k points (median of {n}) | {gp_verify:.0f} ms | < 5 min for an auditor | {gp_verify/co_verify:.2f}× unzip + `cosign verify-blob` of the manifest ({co_verify:.0f} ms) |")
PY
