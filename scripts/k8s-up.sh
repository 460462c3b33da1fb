#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster on this machine, on loopback only,
# for trying gpupass's Kubernetes executor and for its tests
# (internal/testutil/k8stest): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, a containerd of its own and a kubelet, with simulated
# GPUs (the node advertises nvidia.com/gpu and the GPU Feature Discovery
# labels, as the NVIDIA device plugin and GFD would). No Docker, no image
# registry: the binaries come from scripts/k8s-build.sh (Go module proxy,
# cached by version), the pause and busybox images are built from this
# machine's busybox-static (scripts/k8s-image).
#
# Idempotent: when the cluster is already up it is reused (a second or
# so). State, certificates, logs (log/*.log) and PIDs live in the run
# directory ${GPUPASS_K8S_RUN:-/var/tmp/gpupass-k8s}; scripts/k8s-down.sh
# stops exactly those PIDs and removes it. Needs root (containerd, kubelet)
# and the Debian packages of scripts/setup.d/70-kubernetes.sh.
#
# stdout is KEY=VALUE lines, the last one `export KUBECONFIG=...`:
#   eval "$(scripts/k8s-up.sh)"; kubectl get nodes
#
# --run-image (or GPUPASS_K8S_RUN_IMAGE=1) also builds the default run
# image (python3, torch, numpy and this checkout's gpupass-agent, from
# this machine's Debian packages: debimage.RunImageSpec, as the tests
# build it; ~1.3 GB, cached by content key under
# ${GPUPASS_K8S_CACHE:-~/.cache/gpupass/k8s}/images), imports it into the
# cluster's containerd, prints it pinned as GPUPASS_K8S_RUN_IMAGE=NAME@sha256:…
# and, on stderr, the `gpupass up --executor kubernetes` line that uses it.
#
# As root it installs the Debian packages it needs (scripts/lib.sh
# K8S_APT_PACKAGES, and the run image's with --run-image), as `make demo`
# does; without root it stops (containerd and the kubelet need it).
# Ports (loopback): apiserver $GPUPASS_K8S_API_PORT (16443), etcd 12379/12380,
# kubelet 20250, controller-manager 20257, scheduler 20259.
#
# This VM-specific settings (kept, harmless elsewhere): root here lacks
# CAP_SYS_RESOURCE, so containerd gets restrict_oom_score_adj = true (else
# runc fails with "can't get final child's PID from pipe: EOF"); the
# machine has cgroup v1, so the kubelet gets failCgroupV1: false and the
# cgroupfs driver; swap is tolerated (failSwapOn: false).
set -euo pipefail
cd "$(dirname "$0")/.."


RUN="${GPUPASS_K8S_RUN:-/var/tmp/gpupass-k8s}"
API_PORT="${GPUPASS_K8S_API_PORT:-16443}"
ETCD_PORT=12379
ETCD_PEER_PORT=12380
KUBELET_PORT=20250
CM_PORT=20257
SCHED_PORT=20259
NODE="$(hostname | tr '[:upper:]' '[:lower:]')"
GPU_COUNT="${GPUPASS_K8S_GPUS:-4}"
GPU_PRODUCT="${GPUPASS_K8S_GPU_PRODUCT:-NVIDIA-A100-SXM4-80GB}"
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
PAUSE_IMAGE=gpupass.local/pause:1
BUSYBOX_IMAGE=gpupass.local/busybox:1

log() { echo "k8s-up: $*" >&2; }
die() {
	log "$*"
	exit 1
}

WANT_RUN_IMAGE="${GPUPASS_K8S_RUN_IMAGE:-0}"
for a in "$@"; do
	case "$a" in
	--run-image) WANT_RUN_IMAGE=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
		exit 0
		;;
	*) die "unknown argument $a; usage: scripts/k8s-up.sh [--run-image]" ;;
	esac
done

# sudo's secure_path drops the go this needs (scripts/lib.sh, k8s-build.sh):
# the line keeps this PATH.
[ "$(id -u)" = 0 ] || die "needs root (containerd, kubelet and their mounts): sudo env PATH=$(printf %q "$PATH") $(printf '%q ' "$0" "$@")"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
# need_apt writes apt's output to stderr: stdout stays KEY=VALUE lines.
need_apt "${K8S_APT_PACKAGES[@]}" || die "installing ${K8S_APT_PACKAGES[*]} failed"
if [ "$WANT_RUN_IMAGE" = 1 ]; then
	# debimage.RunImagePackages: the demo's, and a shell with coreutils.
	need_apt "${DEMO_APT_PACKAGES[@]}" dash coreutils || die "installing the run image's packages failed"
fi
for t in etcd containerd containerd-shim-runc-v2 runc ctr iptables conntrack openssl curl ip; do
	command -v "$t" >/dev/null || [ -x "/usr/sbin/$t" ] ||
		die "$t not found; install: apt-get install ${K8S_APT_PACKAGES[*]} (scripts/setup.d/70-kubernetes.sh)"
done
[ -x /usr/lib/cni/bridge ] || die "no CNI plugins in /usr/lib/cni; apt-get install containernetworking-plugins"
[ -x /bin/busybox ] || die "no /bin/busybox; apt-get install busybox-static"

# GPUPASS_K8S_BIN: a directory with the five binaries built elsewhere.
BIN="${GPUPASS_K8S_BIN:-$(scripts/k8s-build.sh)}"
export PATH="$BIN:$PATH"
KUBECTL="$BIN/kubectl"

# One k8s-up (or k8s-down) at a time: tests call it from parallel test
# binaries. The lock file is beside the run directory, not in it, so that
# k8s-down removing the directory never splits waiters between two lock
# files; and the daemons never inherit the descriptor (start closes it),
# else they would hold the lock for the cluster's whole life.
LOCK="${RUN%/}.lock"
exec 8>>"$LOCK"
flock -w "${GPUPASS_K8S_LOCK_WAIT:-900}" 8 ||
	die "another k8s-up.sh or k8s-down.sh has held $LOCK for ${GPUPASS_K8S_LOCK_WAIT:-900} s; the PIDs holding it: fuser $LOCK"
mkdir -p "$RUN"

RUN_IMAGE=""
emit() {
	[ -z "$RUN_IMAGE" ] || echo "GPUPASS_K8S_RUN_IMAGE=$RUN_IMAGE"
	echo "GPUPASS_K8S_RUN=$RUN"
	echo "GPUPASS_K8S_NODE=$NODE"
	echo "GPUPASS_K8S_CONTAINERD=$RUN/containerd/containerd.sock"
	echo "GPUPASS_K8S_BIN=$BIN"
	echo "export KUBECONFIG=$RUN/admin.kubeconfig"
}

alive() { [ -f "$RUN/pids/$1" ] && kill -0 "$(cat "$RUN/pids/$1")" 2>/dev/null; }

ctrk() { ctr --address "$RUN/containerd/containerd.sock" --namespace k8s.io "$@"; }

# run_image: with --run-image, build the default run image with this
# checkout's gpupass-agent, import it (once per digest) and print how to
# use it. The image is what the runs see; pinned, so the certified
# environment is this node and this image.
run_image() {
	[ "$WANT_RUN_IMAGE" = 1 ] || return 0
	local cache="${GPUPASS_K8S_CACHE:-$HOME/.cache/gpupass/k8s}/images" out path digest
	mkdir -p "$cache"
	log "building the run image (python3, torch, numpy, gpupass-agent; ~1.3 GB the first time, cached in $cache)"
	# As the tests build it (upstack.BuildAll), so that both make one image.
	CGO_CFLAGS=-Wno-deprecated-declarations go build -trimpath -o "$cache/gpupass-agent" ./cmd/gpupass-agent >&2
	out="$(go run ./scripts/k8s-image --cache "$cache" --run-image --agent "$cache/gpupass-agent")"
	path="${out%% *}"
	digest="${out##* }"
	RUN_IMAGE="gpupass.local/run@$digest"
	if ! ctrk images ls -q | grep -qxF "$RUN_IMAGE"; then
		log "importing $RUN_IMAGE into the cluster's containerd (a minute or more)"
		ctrk images import --digests --base-name gpupass.local/run "$path" >/dev/null
	fi
	log "run image: $RUN_IMAGE"
	log "try it, as root (the kubeconfig is root's):"
	# Bare, so that the whole line pastes.
	echo "KUBECONFIG=$RUN/admin.kubeconfig gpupass up --executor kubernetes --kube-image $RUN_IMAGE" >&2
}

# advertise: what a device plugin and GFD would do. The kubelet keeps
# extended resources it does not manage, but zeroes them when it
# re-registers, so this runs on every start and reuse.
advertise() {
	"$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" patch node "$NODE" --subresource=status --type=merge \
		-p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPU_COUNT\"},\"allocatable\":{\"nvidia.com/gpu\":\"$GPU_COUNT\"}}}" >/dev/null
	"$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" label node "$NODE" --overwrite \
		"nvidia.com/gpu.present=true" "nvidia.com/gpu.product=$GPU_PRODUCT" "nvidia.com/gpu.count=$GPU_COUNT" \
		"nvidia.com/gpu.memory=81920" "nvidia.com/gpu.family=ampere" >/dev/null
}

all_alive() {
	local c
	for c in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet; do alive "$c" || return 1; done
}

if all_alive && "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1; then
	advertise
	run_image
	emit
	exit 0
fi

# Some part is down: stop what is left (exactly our PIDs) and start over,
# keeping certificates and etcd data.
if [ -d "$RUN/pids" ]; then
	GPUPASS_K8S_KEEP_STATE=1 scripts/k8s-down.sh >&2 || true
fi
# (k8s-down with GPUPASS_K8S_KEEP_STATE keeps $RUN and so the lock file we
# hold: re-opening it here would release the lock to a waiting k8s-up.)
mkdir -p "$RUN"/{pki,pids,log,etcd,containerd,cni/net.d,cni/cache,kubelet,images}

# --- certificates -----------------------------------------------------------
pki="$RUN/pki"
cert() { # name CN O [SAN]
	local name="$1" cn="$2" o="$3" san="${4:-}" ext
	[ -f "$pki/$name.crt" ] && return 0
	openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key" 2>/dev/null
	ext="$pki/$name.ext"
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=serverAuth,clientAuth"
		[ -z "$san" ] || echo "subjectAltName=$san"
	} >"$ext"
	openssl req -new -key "$pki/$name.key" -subj "/CN=$cn${o:+/O=$o}" -out "$pki/$name.csr" 2>/dev/null
	openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
		-days 3650 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
}
if [ ! -f "$pki/ca.crt" ]; then
	openssl ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=gpupass-k8s-ca" -days 3650 -out "$pki/ca.crt" 2>/dev/null
fi
cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
cert admin admin system:masters
cert controller-manager system:kube-controller-manager ""
cert scheduler system:kube-scheduler ""
cert node "system:node:$NODE" system:nodes
if [ ! -f "$pki/sa.key" ]; then
	openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key" 2>/dev/null
	openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi
chmod 600 "$pki"/*.key

kubeconfig() { # file user cert
	"$KUBECTL" config --kubeconfig "$1" set-cluster local --server "https://127.0.0.1:$API_PORT" \
		--certificate-authority "$pki/ca.crt" --embed-certs >/dev/null
	"$KUBECTL" config --kubeconfig "$1" set-credentials "$2" --client-certificate "$pki/$3.crt" \
		--client-key "$pki/$3.key" --embed-certs >/dev/null
	"$KUBECTL" config --kubeconfig "$1" set-context local --cluster local --user "$2" >/dev/null
	"$KUBECTL" config --kubeconfig "$1" use-context local >/dev/null
	chmod 600 "$1"
}
kubeconfig "$RUN/admin.kubeconfig" admin admin
kubeconfig "$RUN/controller-manager.kubeconfig" system:kube-controller-manager controller-manager
kubeconfig "$RUN/scheduler.kubeconfig" system:kube-scheduler scheduler
kubeconfig "$RUN/kubelet.kubeconfig" "system:node:$NODE" node

# start NAME CMD...: a daemon in its own session (so a Ctrl-C of the
# caller does not reach it), output to log/NAME.log, PID recorded.
start() {
	local name="$1"
	shift
	setsid "$@" >>"$RUN/log/$name.log" 2>&1 </dev/null 8>&- 9>&- &
	echo $! >"$RUN/pids/$name"
}
wait_for() { # what seconds cmd...
	local what="$1" deadline=$((SECONDS + $2))
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || die "$what not up in time; see $RUN/log/"
		sleep 0.5
	done
}

# --- etcd -------------------------------------------------------------------
start etcd etcd --name default --data-dir "$RUN/etcd" \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "http://127.0.0.1:$((ETCD_PORT + 2))"

# --- containerd (its own: own root, state, socket; not the machine's) --------
cat >"$RUN/containerd/config.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$RUN/containerd/containerd.sock"
[ttrpc]
  address = "$RUN/containerd/containerd.sock.ttrpc"
[debug]
  address = "$RUN/containerd/debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
EOF
cat >"$RUN/cni/net.d/10-gpupass.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "gpupass-k8s",
  "plugins": [
    {"type": "bridge", "bridge": "gpupasscni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$RUN/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
start containerd containerd --config "$RUN/containerd/config.toml"
wait_for containerd 30 ctr --address "$RUN/containerd/containerd.sock" version

# Images the kubelet needs before any pod: the sandbox (pause) image and a
# busybox for tests and the bench; built from busybox-static, cached.
image() { # name entrypoint...
	local name="$1" out path
	shift
	local args=()
	for a in "$@"; do args+=(--entrypoint "$a"); done
	out="$(go run ./scripts/k8s-image --cache "$RUN/images" --name "$name" --busybox "${args[@]}")"
	path="${out%% *}"
	ctrk images import --digests --base-name "${name%:*}" "$path" >/dev/null
}
image "$PAUSE_IMAGE" /bin/sleep 2147483647
image "$BUSYBOX_IMAGE"

# --- control plane ------------------------------------------------------------
wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
start kube-apiserver kube-apiserver \
	--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
	--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
	--client-ca-file "$pki/ca.crt" \
	--kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
	--service-cluster-ip-range "$SERVICE_CIDR" \
	--authorization-mode Node,RBAC --allow-privileged=true \
	--endpoint-reconciler-type none --kubelet-preferred-address-types Hostname \
	--enable-priority-and-fairness=false
wait_for kube-apiserver 300 "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" get --raw /readyz

start kube-controller-manager kube-controller-manager \
	--kubeconfig "$RUN/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$RUN/controller-manager.kubeconfig" --authorization-kubeconfig "$RUN/controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$CM_PORT" \
	--controllers '*,-nodeipam' --leader-elect=false \
	--service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" --use-service-account-credentials \
	--cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
start kube-scheduler kube-scheduler \
	--kubeconfig "$RUN/scheduler.kubeconfig" \
	--authentication-kubeconfig "$RUN/scheduler.kubeconfig" --authorization-kubeconfig "$RUN/scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false

# --- kubelet --------------------------------------------------------------------
cat >"$RUN/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
healthzPort: 0
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$RUN/containerd/containerd.sock
podCIDR: $POD_CIDR
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
staticPodPath: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
evictionPressureTransitionPeriod: 10s
maxPods: 64
# Container logs of its own, not /var/log/pods: k8s-down removes them.
podLogsDir: $RUN/kubelet/pod-logs
EOF
start kubelet kubelet --config "$RUN/kubelet/config.yaml" --kubeconfig "$RUN/kubelet.kubeconfig" \
	--root-dir "$RUN/kubelet/root" --hostname-override "$NODE" \
	--cert-dir "$RUN/kubelet/pki"

node_ready() {
	[ "$("$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" get node "$NODE" \
		-o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
wait_for "node $NODE Ready" 300 node_ready
advertise
log "cluster up: node $NODE Ready with $GPU_COUNT x $GPU_PRODUCT (simulated); logs in $RUN/log"
run_image
emit
