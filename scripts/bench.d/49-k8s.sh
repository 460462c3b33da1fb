#!/usr/bin/env bash
# Kubernetes (issue #22): create a Job and wait for its first log line, on
# the real local cluster (scripts/k8s-up.sh; needs root and
# scripts/setup.d/70-kubernetes.sh). This is the baseline gpupass's
# Kubernetes executor is measured against: what Kubernetes itself takes
# from `kubectl create` to the pod's first output line (scheduling, the
# sandbox, the container start, the log read), p50/p95 over N Jobs.
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${GPUPASS_BENCH_K8S_JOBS:-10}"
eval "$(scripts/k8s-up.sh)"
kubectl="$GPUPASS_K8S_BIN/kubectl"
ns="gpupass-bench-$$"
"$kubectl" create namespace "$ns" >/dev/null
trap '"$kubectl" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true' EXIT
now_ms() { date +%s%3N; }
times=()
for ((i = 0; i < n; i++)); do
	start="$(now_ms)"
	"$kubectl" -n "$ns" create job "first-line-$i" --image=gpupass.local/busybox:1 -- /bin/sh -c 'echo first; sleep 2' >/dev/null
	# logs -f waits for the Job's pod (--pod-running-timeout) and streams
	# from the container's start: one kubectl call, no polling interval.
	line="$("$kubectl" -n "$ns" logs -f --pod-running-timeout=2m "job/first-line-$i" | head -n1)"
	[ "$line" = first ] || {
		echo "49-k8s: job first-line-$i printed ${line@Q}, not first" >&2
		exit 1
	}
	times+=($(($(now_ms) - start)))
	"$kubectl" -n "$ns" delete job "first-line-$i" --wait=false --cascade=background >/dev/null
done
printf '%s\n' "${times[@]}" | sort -n | awk -v n="$n" '{v[NR]=$1}
END {
	p50=v[int((NR+1)/2)]; p95=v[int(NR*0.95+0.999)]; if (p95=="") p95=v[NR]
	printf "| k8s | kubectl create job -> first log line, p50 (%d Jobs, busybox) | %d ms | baseline | - |\n", n, p50
	printf "| k8s | kubectl create job -> first log line, p95 (%d Jobs, busybox) | %d ms | baseline | - |\n", n, p95
}'
