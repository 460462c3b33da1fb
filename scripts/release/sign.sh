#!/usr/bin/env bash
# Signs DIR/checksums.txt into DIR/checksums.txt.sigstore.json (a Sigstore
# bundle: signature, certificate and transparency-log entry), which the
# Action's install script verifies before it trusts any sha256 inside.
# In the release workflow the signature is keyless: the certificate names
# the workflow (.github/workflows/release.yml@refs/tags/vX.Y.Z) through its
# OIDC token. With COSIGN_KEY (a private key file; COSIGN_PASSWORD) it
# signs with that key and no transparency log, for a dry run offline.
set -euo pipefail
dir="${1:?usage: sign.sh DIR}"
cosign="${COSIGN:-cosign}"
if [ ! -f "$dir/checksums.txt" ]; then
	echo "sign.sh: no $dir/checksums.txt; run scripts/release/checksums.sh $dir first" >&2
	exit 1
fi
args=(sign-blob --yes --bundle "$dir/checksums.txt.sigstore.json")
if [ -n "${COSIGN_KEY:-}" ]; then
	args+=(--key "$COSIGN_KEY" --tlog-upload=false)
fi
"$cosign" "${args[@]}" "$dir/checksums.txt" >/dev/null
