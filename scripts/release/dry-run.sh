#!/usr/bin/env bash
# Runs the release steps of .github/workflows/release.yml for the host
# platform, locally and offline, in the repository it is run in:
# stamp.sh VERSION (release commit and tag), build.sh, checksums.sh,
# sign.sh with the key pair in COSIGN_KEY (keyless signing needs the
# workflow's OIDC token), and major-tag.sh move (local, no push). Leaves the
# release assets in DIST and the repository at the tag, with vMAJOR moved.
# What it skips: uploading the GitHub release and the provenance
# attestation (both need GitHub).
#   COSIGN_KEY=cosign.key COSIGN_PASSWORD=… DIST=/tmp/dist scripts/release/dry-run.sh v1.2.0
set -euo pipefail
version="${1:?usage: dry-run.sh VERSION}"
: "${COSIGN_KEY:?COSIGN_KEY: the private key file to sign checksums.txt with}"
export DIST="${DIST:-dist}"
cd "$(git rev-parse --show-toplevel)"
release=scripts/release
"$release/stamp.sh" "$version"
"$release/major-tag.sh" check "$version"
GOOS="$(go env GOHOSTOS)" GOARCH="$(go env GOHOSTARCH)" VERSION="$version" CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}" \
	"$release/build.sh"
"$release/checksums.sh" "$DIST"
"$release/sign.sh" "$DIST"
"$release/major-tag.sh" move "$version"
