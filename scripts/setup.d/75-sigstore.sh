# Waits for the Sigstore test stack's build that 06-sigstore-build.sh
# started (a file test when cached; it builds here if nothing started it).
scripts/sigstore-build.sh >/dev/null || {
	echo "setup: the Sigstore stack build failed; see ${GPUPASS_SIGSTORE_CACHE:-$HOME/.cache/gpupass/sigstore}/build.log" >&2
	false
}
