#!/usr/bin/env bash
# Stops the cluster scripts/k8s-up.sh started and cleans up after it:
# the PIDs it recorded (and nothing else), the containers its containerd
# ran (killed through that containerd, so their shims exit), the mounts
# under its run directory, its CNI bridge, and the run directory itself.
# GPUPASS_K8S_KEEP_STATE=1 (what k8s-up.sh uses to restart a cluster that
# is partly down) keeps certificates, etcd data and imported images.
set -uo pipefail
RUN="${GPUPASS_K8S_RUN:-/var/tmp/gpupass-k8s}"
[ -d "$RUN" ] || exit 0
[ "$(id -u)" = 0 ] || {
	echo "k8s-down: needs root" >&2
	exit 1
}
log() { echo "k8s-down: $*" >&2; }

# Not while a k8s-up.sh is starting the cluster: it would record PIDs we
# never see. k8s-up calls us with GPUPASS_K8S_KEEP_STATE=1 while it holds
# the lock (see there).
if [ "${GPUPASS_K8S_KEEP_STATE:-}" != 1 ]; then
	exec 8>>"${RUN%/}.lock"
	flock -w "${GPUPASS_K8S_LOCK_WAIT:-900}" 8 || {
		log "another k8s-up.sh or k8s-down.sh holds ${RUN%/}.lock (fuser ${RUN%/}.lock)"
		exit 1
	}
fi

pid_of() { cat "$RUN/pids/$1" 2>/dev/null; }
stop() { # name: TERM, up to 10 s, then KILL
	local pid i
	pid="$(pid_of "$1")" || return 0
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		for ((i = 0; i < 40; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.25
		done
		kill -KILL "$pid" 2>/dev/null
	fi
	rm -f "$RUN/pids/$1"
}

stop kubelet
# The pods' containers outlive the kubelet; end them through our own
# containerd while it still runs, so that their shims exit too.
sock="$RUN/containerd/containerd.sock"
if [ -S "$sock" ] && pid="$(pid_of containerd)" && kill -0 "$pid" 2>/dev/null; then
	ctrk() { timeout 30 ctr --address "$sock" --namespace k8s.io "$@"; }
	for id in $(ctrk tasks ls -q 2>/dev/null); do
		ctrk tasks kill --signal SIGKILL "$id" >/dev/null 2>&1
	done
	sleep 1
	for id in $(ctrk tasks ls -q 2>/dev/null); do
		ctrk tasks delete --force "$id" >/dev/null 2>&1
	done
	for id in $(ctrk containers ls -q 2>/dev/null); do
		ctrk containers delete "$id" >/dev/null 2>&1
	done
fi
for c in kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do stop "$c"; done

# Mounts under the run dir (pod volumes, overlay snapshots, sandbox
# netns and shm), deepest first.
awk -v run="$RUN/" 'index($2, run) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
	umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
done

if [ "${GPUPASS_K8S_KEEP_STATE:-}" = 1 ]; then
	rm -rf "$RUN/containerd/state" "$RUN/kubelet/root" "$RUN/cni/ipam" "$RUN/cni/cache"
	exit 0
fi
ip link show gpupasscni0 >/dev/null 2>&1 && ip link delete gpupasscni0
rm -f /var/lib/cni/results/gpupass-k8s-* 2>/dev/null
rm -rf "$RUN"
log "stopped; removed $RUN"
