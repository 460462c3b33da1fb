# A real one-node Kubernetes cluster for the Kubernetes executor's tests
# (internal/testutil/k8stest, scripts/k8s-up.sh): etcd, containerd, runc,
# the CNI plugins, iptables and conntrack from Debian, busybox-static for
# the sandbox image, and Kubernetes itself built from the Go module proxy
# (scripts/k8s-build.sh; cached by version outside the repo: ~13 min and
# ~2.1 GB RAM cold on 2 cores, a file test warm).
need_apt etcd-server containerd runc containernetworking-plugins iptables conntrack busybox-static openssl
scripts/k8s-build.sh >/dev/null
