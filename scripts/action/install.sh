#!/usr/bin/env bash
# Installs gpupass for the GitHub Action: the released binary for this
# runner's OS and architecture, trusted only after the release's
# checksums.txt verifies against its Sigstore bundle and the archive
# against the sha256 inside it; or, only when asked for ("source", or an
# unreleased action checkout), a build from the action's own checkout. A
# named release that cannot be downloaded is an error, never a reason to
# build something else. Puts gpupass on GITHUB_PATH. Inputs come only
# through the environment:
#
#   GPUPASS_INSTALL_VERSION    a release tag (vX.Y.Z), "latest" (resolved to
#                              its tag first) or "source"; empty: the
#                              action's own release (scripts/action/version,
#                              stamped by scripts/release/stamp.sh; "dev" on
#                              an unreleased commit, which builds from source)
#   GPUPASS_INSTALL_COSIGN     cosign binary to verify with; default: cosign
#                              ${cosign_version} downloaded and checked against
#                              its pinned sha256 below
#   GPUPASS_INSTALL_COSIGN_PUBLIC_KEY
#                              verify against this public key file instead of
#                              the keyless identity (a mirror that re-signs the
#                              release with its own key; the tests)
#
# By default the signature must be a keyless one made by this repository's
# release workflow (.github/workflows/release.yml) run for the very tag
# asked for, through GitHub Actions' OIDC issuer: anyone who can upload
# release assets but not run that workflow cannot make a binary this
# script accepts, and the signed checksums.txt of another (older) release
# served under this tag's URL does not verify. Whatever the signature, the
# installed gpupass must also report that tag as its version.
set -euo pipefail

action_path="${GPUPASS_ACTION_PATH:?GPUPASS_ACTION_PATH is not set}"
version="${GPUPASS_INSTALL_VERSION:-}"
# Why a source build was chosen, for the log; empty: install a release.
source_reason=""
if [ -z "$version" ]; then
	version="$(tr -d ' \t\r\n' <"$action_path/scripts/action/version" 2>/dev/null || true)"
	case "$version" in
	"" | dev) source_reason="the action's checkout is not a release (scripts/action/version says ${version:-nothing})" ;;
	esac
fi
if [ "$version" = source ]; then
	source_reason="version: source was asked for"
fi
repo="${GPUPASS_ACTION_REPOSITORY:-}"
dest="${RUNNER_TEMP:-${TMPDIR:-/tmp}}/gpupass-bin"
mkdir -p "$dest"
# The download goes next to the install dir and is removed however the
# script ends: self-hosted runners keep their temp dirs between jobs.
download=""
trap 'if [ -n "$download" ]; then rm -rf "$download"; fi' EXIT

fail() {
	echo "::error title=gpupass install::$*"
	exit 1
}

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

# cosign for the verification when none is given: the release
# sigstore/cosign-installer v4.1.2 bootstraps from, with the digests it pins.
cosign_version=v3.0.6
cosign_sha256() {
	case "$1" in
	linux_amd64) echo c956e5dfcac53d52bcf058360d579472f0c1d2d9b69f55209e256fe7783f4c74 ;;
	linux_arm64) echo bedac92e8c3729864e13d4a17048007cfafa79d5deca993a43a90ffe018ef2b8 ;;
	darwin_amd64) echo 4c3e7af8372d3ca3296e62fa56f23fcbb5721cc6ac1827900d398f110d7cd280 ;;
	darwin_arm64) echo 5fadd012ae6381a6a29ff86a7d39aa873878852f1073fc90b15995961ecfb084 ;;
	esac
}

sha256_of() {
	if command -v sha256sum >/dev/null; then
		sha256sum "$1" | cut -d' ' -f1
	else
		shasum -a 256 "$1" | cut -d' ' -f1
	fi
}

# find_cosign sets cosign (not through $(…): fail must end the script).
find_cosign() {
	if [ -n "${GPUPASS_INSTALL_COSIGN:-}" ]; then
		cosign="$GPUPASS_INSTALL_COSIGN"
		return
	fi
	local want bin="$download/cosign"
	want="$(cosign_sha256 "${os}_${arch}")"
	[ -n "$want" ] || fail "no pinned cosign for ${os}/${arch} to verify the release with: set GPUPASS_INSTALL_COSIGN to a cosign binary, or use version: source"
	curl -fsSL --retry 3 -o "$bin" "https://github.com/sigstore/cosign/releases/download/${cosign_version}/cosign-${os}-${arch}" ||
		fail "downloading cosign ${cosign_version} to verify the release failed; set GPUPASS_INSTALL_COSIGN to a cosign binary"
	[ "$(sha256_of "$bin")" = "$want" ] || fail "cosign ${cosign_version} for ${os}/${arch} does not match its pinned sha256; not trusting it"
	chmod +x "$bin"
	cosign="$bin"
}

# The keyless identity: this repository's release workflow, run for the
# tag being installed (not any v* tag: an older release's checksums.txt
# must not pass for this one's).
identity() {
	printf 'https://github.com/%s/.github/workflows/release.yml@refs/tags/%s' "$repo" "$tag"
}

# verify_checksums fails the install unless checksums.txt carries a valid
# signature: a tampered checksum file is an error, never a fallback.
verify_checksums() {
	local out
	find_cosign
	local args=(verify-blob --bundle "$download/checksums.txt.sigstore.json")
	if [ -n "${GPUPASS_INSTALL_COSIGN_PUBLIC_KEY:-}" ]; then
		# A key-pair signature carries no transparency-log entry.
		args+=(--key "$GPUPASS_INSTALL_COSIGN_PUBLIC_KEY" --insecure-ignore-tlog=true)
	else
		args+=(--certificate-identity "$(identity)"
			--certificate-oidc-issuer https://token.actions.githubusercontent.com)
	fi
	if ! out="$("$cosign" "${args[@]}" "$download/checksums.txt" 2>&1)"; then
		printf '%s\n' "$out" >&2
		fail "the signature of checksums.txt from $base does not verify (cosign verify-blob); not installing. The release was not made by ${repo}'s release workflow for ${tag}, or was changed after"
	fi
	printf '%s\n' "$out" >&2
}

# fetch downloads $1 to $2 or fails the install naming what was missing.
fetch() {
	local err
	if ! err="$(curl -fsSL --retry 3 -o "$2" "$1" 2>&1)"; then
		fail "cannot download gpupass ${tag} for ${os}/${arch}: $1: ${err##*curl: }. Check that release ${tag} exists at ${GITHUB_SERVER_URL}/${repo}/releases, or set version: source to build from the action's checkout (needs Go); nothing else is installed instead"
	fi
}

# resolve_tag sets tag: the version asked for, or the tag "latest" points
# at now (GitHub answers /releases/latest with a redirect to it).
resolve_tag() {
	local url
	if [ "$version" != latest ]; then
		tag="$version"
	elif ! url="$(curl -fsS --retry 3 -o /dev/null -w '%{redirect_url}' "${GITHUB_SERVER_URL}/${repo}/releases/latest" 2>&1)"; then
		fail "cannot find the latest release of ${repo} (${url##*curl: }); name a version (vX.Y.Z)"
	else
		tag="${url##*/releases/tag/}"
		[ "$tag" != "$url" ] || fail "cannot find the latest release of ${repo}: ${GITHUB_SERVER_URL}/${repo}/releases/latest does not redirect to a release tag; name a version (vX.Y.Z)"
	fi
	# The tag goes into URLs and the signer's identity.
	[[ "$tag" =~ ^v[0-9][0-9A-Za-z.+-]*$ ]] ||
		fail "version ${tag} is not a release tag: give vX.Y.Z, latest or source"
}

from_release() {
	[ -n "$repo" ] || fail "cannot install release ${version}: the action's repository is unknown (github.action_repository is empty when the action runs from a local path); set version: source to build from the action's checkout"
	if [ -z "$os" ] || [ -z "$arch" ]; then
		fail "no gpupass release is built for ${RUNNER_OS:-$(uname -s)}/${RUNNER_ARCH:-$(uname -m)}; set version: source to build from the action's checkout (needs Go)"
	fi
	: "${GITHUB_SERVER_URL:?GITHUB_SERVER_URL is not set}"
	resolve_tag
	local asset="gpupass_${os}_${arch}.tar.gz"
	base="${GITHUB_SERVER_URL}/${repo}/releases/download/${tag}"
	download="$(mktemp -d "$(dirname "$dest")/gpupass-download.XXXXXX")"
	fetch "$base/$asset" "$download/$asset"
	fetch "$base/checksums.txt" "$download/checksums.txt"
	curl -fsSL --retry 3 -o "$download/checksums.txt.sigstore.json" "$base/checksums.txt.sigstore.json" ||
		fail "the release at $base has no checksums.txt.sigstore.json: cannot verify checksums.txt, not installing"
	verify_checksums
	(cd "$download" && grep " ${asset}\$" checksums.txt | sha256sum -c -) >&2 ||
		fail "checksum mismatch for $asset from $base"
	tar -xzf "$download/$asset" -C "$dest" gpupass
	# With a key-pair signature nothing above names the tag: the binary
	# must.
	local got
	got="$("$dest/gpupass" version 2>&1 | head -n 1)" || true
	if [ "$(printf '%s' "$got" | cut -d' ' -f2)" != "$tag" ]; then
		rm -f "$dest/gpupass"
		fail "the release at $base holds \"${got}\", not gpupass ${tag}: not installing"
	fi
}

from_source() {
	if ! command -v go >/dev/null; then
		fail "building gpupass from source because ${source_reason}, but Go is not installed (add actions/setup-go)"
	fi
	echo "building gpupass from source in ${action_path}: ${source_reason}" >&2
	(cd "$action_path" && CGO_ENABLED=0 go build -trimpath -o "$dest/" ./cmd/gpupass)
}

base="" cosign="" tag=""
if [ -n "$source_reason" ]; then
	from_source
else
	from_release
fi
"$dest/gpupass" version >&2
echo "$dest" >>"${GITHUB_PATH:?GITHUB_PATH is not set}"
