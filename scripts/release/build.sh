#!/usr/bin/env bash
# Builds the release archives for GOOS/GOARCH into ${DIST:-dist}/:
# gpupass_<os>_<arch>.tar.gz (the CLI, gpupass, one binary with every
# command; what the GitHub Action installs) and, on a
# native runner, gpupass-all_<os>_<arch>.tar.gz (CLI, broker and, on
# Linux, the agent: gpupass-agent for a GPU node, built -tags nokube so it
# links no client-go and stays under 15 MiB, and gpupass-agent-kubernetes,
# the agent with the Kubernetes executor that the gpupass-agent image
# holds, which runs in or beside a cluster).
# The CLI is pure Go and cross-compiles. The agent links NVML through cgo
# and uses Linux process APIs, so it is built natively and for Linux only
# (the release workflow runs one native runner per platform); a cross
# build makes the CLI archive alone, and REQUIRE_NATIVE=1 turns that into
# an error so a release never ships without the -all archive.
set -euo pipefail
: "${GOOS:?}" "${GOARCH:?}" "${VERSION:?}"
dist="${DIST:-dist}"
ldflags="-s -w -X github.com/gpupass/gpupass/internal/buildinfo.Version=${VERSION}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p "$dist"
export GOOS GOARCH
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/" ./cmd/gpupass
tar -czf "$dist/gpupass_${GOOS}_${GOARCH}.tar.gz" -C "$out" gpupass
if [ "$GOOS/$GOARCH" != "$(go env GOHOSTOS)/$(go env GOHOSTARCH)" ]; then
	if [ "${REQUIRE_NATIVE:-0}" = 1 ]; then
		echo "build.sh: the broker and agent archive is built on a native $GOOS/$GOARCH runner only" >&2
		exit 1
	fi
	echo "build.sh: cross build for $GOOS/$GOARCH: the CLI archive only" >&2
	exit 0
fi
bins=(gpupass gpupass-broker)
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass-broker" ./cmd/gpupass-broker
if [ "$GOOS" = linux ]; then
	CGO_ENABLED=1 go build -trimpath -tags nokube -ldflags "$ldflags" -o "$out/gpupass-agent" ./cmd/gpupass-agent
	CGO_ENABLED=1 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass-agent-kubernetes" ./cmd/gpupass-agent
	bins+=(gpupass-agent gpupass-agent-kubernetes)
fi
tar -czf "$dist/gpupass-all_${GOOS}_${GOARCH}.tar.gz" -C "$out" "${bins[@]}"
