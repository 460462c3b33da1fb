# A real OCI registry server and the oras CLI for the bundle e2e, interop
# tests and benchmarks (issue 6). Debian's docker-registry (distribution
# 2.8) is unpacked into a cache dir rather than installed, so no system
# service is started; tests start their own on a loopback port.
REGISTRY_CACHE="${GPUPASS_CACHE:-$HOME/.cache/gpupass}/docker-registry"
if [ ! -x "$REGISTRY_CACHE/usr/bin/docker-registry" ]; then
	echo "setup: unpacking docker-registry into $REGISTRY_CACHE" >&2
	_tmp="$(mktemp -d)"
	if [ -z "$_apt_updated" ] && ! apt-cache show docker-registry >/dev/null 2>&1; then
		apt-get update -qq >&2 && _apt_updated=1
	fi
	chmod 755 "$_tmp"; (cd "$_tmp" && apt-get download -qq docker-registry >&2) &&
		mkdir -p "$REGISTRY_CACHE" &&
		dpkg-deb -x "$_tmp"/docker-registry_*.deb "$REGISTRY_CACHE"
	rm -rf "$_tmp"
fi
# Tests find the server here (or through GPUPASS_TEST_REGISTRY_BIN).
ln -sf "$REGISTRY_CACHE/usr/bin/docker-registry" "$GOBIN_DIR/docker-registry"
need_go_tool oras oras.land/oras/cmd/oras@v1.3.6
