#!/usr/bin/env bash
# Builds the three release archives for GOOS/GOARCH into dist/:
# gpupass_<os>_<arch>.tar.gz (the CLI alone, what the GitHub Action
# installs) and gpupass-all_<os>_<arch>.tar.gz (CLI, broker, agent).
# The agent needs cgo for NVML, so run this on a native runner.
set -euo pipefail
: "${GOOS:?}" "${GOARCH:?}" "${VERSION:?}"
ldflags="-s -w -X github.com/gpupass/gpupass/internal/cli.Version=${VERSION}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p dist
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass" ./cmd/gpupass
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass-broker" ./cmd/gpupass-broker
CGO_ENABLED=1 go build -trimpath -ldflags "$ldflags" -o "$out/gpupass-agent" ./cmd/gpupass-agent
tar -czf "dist/gpupass_${GOOS}_${GOARCH}.tar.gz" -C "$out" gpupass
tar -czf "dist/gpupass-all_${GOOS}_${GOARCH}.tar.gz" -C "$out" gpupass gpupass-broker gpupass-agent
