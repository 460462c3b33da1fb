#!/usr/bin/env bash
# Builds the release archives for GOOS/GOARCH into ${DIST:-dist}/:
# gpupass_<os>_<arch>.tar.gz (the CLI alone, what the GitHub Action
# installs) and gpupass-all_<os>_<arch>.tar.gz (CLI, broker, agent).
# The CLI and the broker are pure Go and cross-compile. The agent links
# NVML through cgo, so it is built only for the host platform (the release
# workflow runs one native runner per platform); a cross build leaves it
# and the -all archive out, and REQUIRE_AGENT=1 turns that into an error.
set -euo pipefail
: "${GOOS:?}" "${GOARCH:?}" "${VERSION:?}"
dist="${DIST:-dist}"
ldflags="-s -w -X github.com/gpupass/gpupass/internal/cli.Version=${VERSION}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p "$dist"
export GOOS GOARCH
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass" ./cmd/gpupass
tar -czf "$dist/gpupass_${GOOS}_${GOARCH}.tar.gz" -C "$out" gpupass
if [ "$GOOS/$GOARCH" != "$(go env GOHOSTOS)/$(go env GOHOSTARCH)" ]; then
	if [ "${REQUIRE_AGENT:-0}" = 1 ]; then
		echo "build.sh: the agent needs cgo and builds only on a native $GOOS/$GOARCH runner" >&2
		exit 1
	fi
	echo "build.sh: cross build for $GOOS/$GOARCH: gpupass only (the agent needs cgo on a native runner)" >&2
	exit 0
fi
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass-broker" ./cmd/gpupass-broker
CGO_ENABLED=1 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass-agent" ./cmd/gpupass-agent
tar -czf "$dist/gpupass-all_${GOOS}_${GOARCH}.tar.gz" -C "$out" gpupass gpupass-broker gpupass-agent
