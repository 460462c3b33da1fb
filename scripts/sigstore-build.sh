#!/usr/bin/env bash
# Builds the Sigstore services the keyless tests run on loopback
# (internal/testutil/sigstoretest) from the Go module proxy, once per
# version, into a cache OUTSIDE the repository:
#   ${GPUPASS_SIGSTORE_CACHE:-$HOME/.cache/gpupass/sigstore}/<name>-<version>/bin/
# and prints the cache root. Quick (a file test) when the cache is there.
#
# They are programs the tests start, not libraries gpupass links: `go
# install module/cmd@version` builds each with its own go.mod, so none of
# them enters gpupass's go.mod.
#
# The versions are the ones the tests were run with (issue #37): rekor-tiles
# v2.3.0 refuses the DSSE entries attestations need. sigstoretest.Components
# names the same; TestBuildScriptVersions holds the two together.
set -euo pipefail

cache_root="${GPUPASS_SIGSTORE_CACHE:-$HOME/.cache/gpupass/sigstore}"
# name version package binary
components=(
	"fulcio v1.8.8 github.com/sigstore/fulcio fulcio"
	"rekor-tiles v2.2.1 github.com/sigstore/rekor-tiles/v2/cmd/rekor-server/posix posix"
	"timestamp-authority v2.1.3 github.com/sigstore/timestamp-authority/v2/cmd/timestamp-server timestamp-server"
	"tesseract v0.1.1 github.com/transparency-dev/tesseract/cmd/tesseract/posix posix"
)

have_all() {
	local c name ver pkg bin
	for c in "${components[@]}"; do
		read -r name ver pkg bin <<<"$c"
		[ -x "$cache_root/$name-$ver/bin/$bin" ] || return 1
	done
}
if have_all; then
	echo "$cache_root"
	exit 0
fi
# --check: only say (exit status) whether the cache is complete.
[ "${1:-}" != --check ] || exit 1

mkdir -p "$cache_root"
# One build per cache at a time: a second caller (setup, a test) waits, then
# finds the cache.
exec 9>"$cache_root/.build.lock"
flock 9

t0=$SECONDS
export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -trimpath"
for c in "${components[@]}"; do
	read -r name ver pkg bin <<<"$c"
	dir="$cache_root/$name-$ver"
	[ -x "$dir/bin/$bin" ] && continue
	t=$SECONDS
	tmp="$dir/bin.tmp.$$"
	rm -rf "$tmp"
	mkdir -p "$tmp"
	# CGO off: static binaries that need nothing from the machine at run time.
	CGO_ENABLED=0 GOBIN="$tmp" nice -n "${SIGSTORE_BUILD_NICE:-19}" go install "$pkg@$ver" >&2
	[ -x "$tmp/$bin" ] || {
		echo "sigstore-build: go install $pkg@$ver wrote no $bin" >&2
		exit 1
	}
	rm -rf "${dir:?}/bin"
	mv "$tmp" "$dir/bin"
	echo "sigstore-build: built $name $ver in $((SECONDS - t)) s" >&2
done
echo "sigstore-build: built the Sigstore stack in $(((SECONDS - t0) / 60)) min $(((SECONDS - t0) % 60)) s" >&2
echo "$cache_root"
