# Starts the build of the local Sigstore stack for the keyless tests
# (scripts/sigstore-build.sh: Fulcio, rekor-tiles, timestamp-authority and
# TesseraCT from the Go module proxy; minutes cold, nothing when cached) in
# the background, like 05-kubernetes-build.sh, so that it overlaps the
# Debian installs that follow; 75-sigstore.sh waits for it, and
# internal/testutil/sigstoretest waits for a build in progress. Its output
# goes to build.log in the cache root; build.pid is its process group.
sigstore_cache="${GPUPASS_SIGSTORE_CACHE:-$HOME/.cache/gpupass/sigstore}"
mkdir -p "$sigstore_cache"
if ! scripts/sigstore-build.sh --check 2>/dev/null && flock -n "$sigstore_cache/.build.lock" true; then
	echo "setup: building the Sigstore test stack in the background (log: $sigstore_cache/build.log)" >&2
	setsid scripts/sigstore-build.sh >"$sigstore_cache/build.log" 2>&1 </dev/null &
	echo $! >"$sigstore_cache/build.pid"
fi
