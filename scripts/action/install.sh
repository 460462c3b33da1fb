#!/usr/bin/env bash
# Installs gpupass for the GitHub Action: the released binary for this
# runner's OS and architecture, checked against the release's sha256
# checksum file; or, when no release matches or GPUPASS_INSTALL_VERSION is
# "source", a build from the action's own checkout. Puts gpupass on
# GITHUB_PATH. Inputs come only through the environment.
set -euo pipefail

version="${GPUPASS_INSTALL_VERSION:-latest}"
action_path="${GPUPASS_ACTION_PATH:?GPUPASS_ACTION_PATH is not set}"
repo="${GPUPASS_ACTION_REPOSITORY:-}"
dest="${RUNNER_TEMP:-${TMPDIR:-/tmp}}/gpupass-bin"
mkdir -p "$dest"
# The download goes next to the install dir and is removed however the
# script ends: self-hosted runners keep their temp dirs between jobs.
download=""
trap 'if [ -n "$download" ]; then rm -rf "$download"; fi' EXIT

case "${RUNNER_OS:-$(uname -s)}" in
Linux) os=linux ;;
macOS | Darwin) os=darwin ;;
*) os="" ;;
esac
case "${RUNNER_ARCH:-$(uname -m)}" in
X64 | x86_64) arch=amd64 ;;
ARM64 | arm64 | aarch64) arch=arm64 ;;
*) arch="" ;;
esac

from_release() {
	[ "$version" != source ] && [ -n "$repo" ] && [ -n "$os" ] && [ -n "$arch" ] || return 1
	local asset="gpupass_${os}_${arch}.tar.gz" base
	if [ "$version" = latest ]; then
		base="${GITHUB_SERVER_URL:?}/${repo}/releases/latest/download"
	else
		base="${GITHUB_SERVER_URL:?}/${repo}/releases/download/${version}"
	fi
	download="$(mktemp -d "$(dirname "$dest")/gpupass-download.XXXXXX")"
	curl -fsSL --retry 3 -o "$download/$asset" "$base/$asset" || return 1
	curl -fsSL --retry 3 -o "$download/checksums.txt" "$base/checksums.txt" || return 1
	# A download that does not match the published checksum is an error,
	# never a reason to fall back.
	(cd "$download" && grep " ${asset}\$" checksums.txt | sha256sum -c -) >&2 || {
		echo "::error title=gpupass install::checksum mismatch for $asset from $base"
		exit 1
	}
	tar -xzf "$download/$asset" -C "$dest" gpupass
}

from_source() {
	if ! command -v go >/dev/null; then
		echo "::error title=gpupass install::no gpupass release for ${os:-this OS}/${arch:-this arch} at version ${version}, and Go is not installed to build it (add actions/setup-go)"
		exit 1
	fi
	echo "building gpupass from ${action_path}" >&2
	(cd "$action_path" && CGO_ENABLED=0 go build -trimpath -o "$dest/gpupass" ./cmd/gpupass)
}

if ! from_release; then
	from_source
fi
"$dest/gpupass" version >&2
echo "$dest" >>"${GITHUB_PATH:?GITHUB_PATH is not set}"
