# A real one-node Kubernetes cluster for the Kubernetes executor's tests
# (internal/testutil/k8stest, scripts/k8s-up.sh): etcd, containerd, runc,
# the CNI plugins, iptables and conntrack from Debian, busybox-static for
# the sandbox image, curl and iproute2 for k8s-up/down (neither is in a
# minimal Debian), and Kubernetes itself built from the Go module proxy
# (scripts/k8s-build.sh, started in the background by 05-kubernetes-build.sh;
# cached by version outside the repo).
need_apt "${K8S_APT_PACKAGES[@]}"
# Wait for the build (a file test when cached), unless the caller lets the
# tests wait for it instead (GPUPASS_K8S_BUILD_WAIT=0; .ci/run does not, see there).
if [ "${GPUPASS_K8S_BUILD_WAIT:-1}" != 0 ]; then
	scripts/k8s-build.sh >/dev/null || {
		echo "setup: the Kubernetes build failed; see ${GPUPASS_K8S_CACHE:-$HOME/.cache/gpupass/k8s}/${K8S_VERSION:-v1.36.3}/build.log" >&2
		false
	}
fi
