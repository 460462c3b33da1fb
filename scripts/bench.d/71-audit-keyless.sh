#!/usr/bin/env bash
# Keyless audit reports (issue 37): sign + verify of one audit report
# keyless on the private Sigstore (Fulcio, Rekor v2, timestamp authority;
# scripts/sigstore-build.sh), as processes, beside `cosign sign-blob` +
# `cosign verify-blob` keyless of the same report's manifest.json on the
# same services, in the same run (BenchmarkKeylessVsCosign; p50/p95 of
# KEYLESS_BENCH_RUNS pairs, default 15).
# Prints markdown rows: | area | figure | value | goal | vs peer |
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! scripts/sigstore-build.sh --check >/dev/null 2>&1; then
	echo "| audit keyless | sign + verify vs cosign | the private Sigstore is not built (scripts/sigstore-build.sh) | | |"
	exit 0
fi
if ! command -v cosign >/dev/null; then
	echo "| audit keyless | sign + verify vs cosign | cosign not installed (make deps) | | |"
	exit 0
fi
out="$(go test ./internal/command/gpupass/auditcmd -run '^$' -bench '^BenchmarkKeylessVsCosign$' -benchtime 1x 2>&1)" || {
	echo "$out" >&2
	exit 1
}
line="$(grep '^BenchmarkKeylessVsCosign' <<<"$out")"
# metric NAME: the value reported before the unit NAME
m() { awk -v u="$1" '{for (i = 2; i <= NF; i++) if ($i == u) print $(i-1)}' <<<"$line"; }
n="${KEYLESS_BENCH_RUNS:-15}"
row() { # figure, gpupass metric, cosign metric, peer's name
	local gp50 gp95 co50 co95
	gp50="$(m "gp-$2-p50-ms")" gp95="$(m "gp-$2-p95-ms")" co50="$(m "cosign-$3-p50-ms")" co95="$(m "cosign-$3-p95-ms")"
	awk -v f="$1" -v g50="$gp50" -v g95="$gp95" -v c50="$co50" -v c95="$co95" -v peer="$4" -v n="$n" 'BEGIN {
		printf "| audit keyless | %s (p50 / p95 of %d) | %.0f / %.0f ms | — | %.2f× / %.2f× %s (%.0f / %.0f ms) |\n", f, n, g50, g95, g50/c50, g95/c95, peer, c50, c95 }'
}
row '`gpupass audit` keyless: build the zip, certificate, log entry, signed timestamp' sign sign '`cosign sign-blob` keyless of its manifest'
row '`gpupass audit verify` by identity, every layer' verify verify '`cosign verify-blob` by identity'
row 'sign + verify' total total '`cosign sign-blob` + `verify-blob`'
