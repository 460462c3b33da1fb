#!/usr/bin/env bash
# Kubernetes (issue #22): submit -> first output line through Kubernetes,
# p50/p95, on the real local cluster (scripts/k8s-up.sh; needs root and
# scripts/setup.d/70-kubernetes.sh; started when it is not running).
#
# Two parts, in the same run:
#  1. the baseline of Kubernetes itself, from the command line: `kubectl
#     create` of a Job shaped like the executor's (one nvidia.com/gpu,
#     pinned to the node through the scheduler, `echo first`, busybox),
#     then `kubectl logs -f` until its first line: scheduling, the
#     sandbox, the container start and the log read, each Job timed from
#     before `create` to the moment the line is read;
#  2. gpupass's Kubernetes runner against the same Job created with the
#     API and read with `kubectl logs -f`, alternated in one process, same
#     image and poll interval (BenchmarkSubmitToFirstLine in
#     agent/executor/kubernetes; skipped while that package is absent).
# Goal: gpupass adds under 20% to what Kubernetes itself takes.
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${GPUPASS_BENCH_K8S_JOBS:-10}"
eval "$(scripts/k8s-up.sh)"
kubectl="$GPUPASS_K8S_BIN/kubectl"
ns="gpupass-bench-$$"
tmp="$(mktemp -d)"
"$kubectl" create namespace "$ns" >/dev/null
trap '"$kubectl" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
now_ms() { date +%s%3N; }
times=()
for ((i = 0; i < n; i++)); do
	job="first-line-$i"
	start="$(now_ms)"
	"$kubectl" -n "$ns" create -f - >/dev/null <<JOB
apiVersion: batch/v1
kind: Job
metadata: {name: $job}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [$GPUPASS_K8S_NODE]}]}]}}}
      containers:
      - name: run
        image: gpupass.local/busybox:1
        imagePullPolicy: IfNotPresent
        command: ["echo", "first"]
        resources: {limits: {nvidia.com/gpu: 1}}
JOB
	# logs -f waits for the Job's pod (--pod-running-timeout) and streams
	# from the container's start; the line is timed as it is read, not
	# when kubectl ends.
	line=""
	{ read -r line || true; now_ms >"$tmp/t"; } < <("$kubectl" -n "$ns" logs -f --pod-running-timeout=2m "job/$job" 2>"$tmp/err")
	[ "$line" = first ] || {
		echo "49-k8s: Job $job printed ${line@Q}, not first: $(cat "$tmp/err")" >&2
		exit 1
	}
	times+=($(($(cat "$tmp/t") - start)))
	# Free the GPU for the next Job before it is created.
	"$kubectl" -n "$ns" delete job "$job" --cascade=foreground >/dev/null
done
printf '%s\n' "${times[@]}" | sort -n | awk -v n="$n" '{v[NR]=$1}
END {
	p50=v[int((NR+1)/2)]; p95=v[int(NR*0.95+0.999)]; if (p95=="") p95=v[NR]
	printf "| k8s | kubectl create job -> first log line, p50 (%d Jobs, busybox, 1 GPU) | %d ms | baseline | - |\n", n, p50
	printf "| k8s | kubectl create job -> first log line, p95 (%d Jobs, busybox, 1 GPU) | %d ms | baseline | - |\n", n, p95
}'

if ! grep -qs 'func BenchmarkSubmitToFirstLine' agent/executor/kubernetes/*_test.go; then
	echo "| k8s | submit -> first output line (gpupass runner vs kubectl) | not built: no agent/executor/kubernetes | < 1.2x | - |"
	exit 0
fi
go test -run '^$' -bench 'BenchmarkSubmitToFirstLine' -benchtime "${n}x" -count 1 ./agent/executor/kubernetes/ >"$tmp/bench.txt"
awk '/^BenchmarkSubmitToFirstLine/ {
	for (i=2; i<=NF; i++) v[$(i+1)]=$i
	printf "| k8s | submit -> first output line, p50 (gpupass runner vs kubectl create + logs -f, run image) | %.0f ms vs %.0f ms | < 1.2x | %.2fx |\n", v["gpupass-p50-ms"], v["kubectl-p50-ms"], v["gpupass-p50-ms"]/v["kubectl-p50-ms"]
	printf "| k8s | submit -> first output line, p95 (gpupass runner vs kubectl create + logs -f, run image) | %.0f ms vs %.0f ms | < 1.2x | %.2fx |\n", v["gpupass-p95-ms"], v["kubectl-p95-ms"], v["gpupass-p95-ms"]/v["kubectl-p95-ms"]
}' "$tmp/bench.txt"
