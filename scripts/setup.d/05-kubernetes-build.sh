# Starts the Kubernetes build for the local test cluster (scripts/k8s-build.sh:
# ~13 min and ~2.1 GB RAM cold on 2 cores, nothing when cached) in the
# background, first, so that it overlaps what follows: the Debian packages
# of the other setup.d scripts and, when GPUPASS_K8S_BUILD_WAIT=0,
# lint, generate and the other tests too; 70-kubernetes.sh waits for it
# otherwise, and internal/testutil/k8stest.Require waits for a build in
# progress. Its output goes to build.log beside the binaries; build.pid is
# the process group, which .ci/run ends if it is still going at exit.
k8s_build_dir="${GPUPASS_K8S_CACHE:-$HOME/.cache/gpupass/k8s}/${K8S_VERSION:-v1.36.3}"
if [ -z "${GPUPASS_K8S_BIN:-}" ] && ! [ -x "$k8s_build_dir/bin/kubectl" ]; then
	mkdir -p "$k8s_build_dir"
	# A build in progress (another setup, a test) holds the lock: leave it.
	if flock -n "$k8s_build_dir/.build.lock" true; then
		echo "setup: building Kubernetes in the background (log: $k8s_build_dir/build.log)" >&2
		setsid scripts/k8s-build.sh >"$k8s_build_dir/build.log" 2>&1 </dev/null &
		echo $! >"$k8s_build_dir/build.pid"
	fi
fi
