package agent

import (
	"time"

	"github.com/spf13/cobra"

	daemon "github.com/gpupass/gpupass/agent"
)

// addKubeFlags registers the --kube-* flags (agent/kubernetes.go holds
// what they do).
func addKubeFlags(cmd *cobra.Command, o *daemon.Options) {
	f := cmd.Flags()
	k := &o.Kube
	f.StringVar(&k.Kubeconfig, "kubeconfig", "", "with --executor kubernetes: kubeconfig file (default $KUBECONFIG, then ~/.kube/config, then the pod's service account)")
	f.StringVar(&k.Namespace, "kube-namespace", "gpupass", "with --executor kubernetes: namespace of the runs' and conformance checks' Jobs")
	f.StringVar(&k.Image, "kube-image", "", "with --executor kubernetes: the runs' container image, pinned by digest (NAME@sha256:…); the certified environment is a node and this image")
	f.StringVar(&k.Cluster, "kube-cluster", "", "with --executor kubernetes: cluster name in node ids and the provider kubernetes:NAME (default: the kubeconfig's current cluster)")
	f.StringVar(&k.SharedDir, "kube-shared-dir", "", "with --executor kubernetes: absolute directory the agent and every pod see at the same path (runs' work dirs, output, metrics, checkpoints); a hostPath unless --kube-shared-claim")
	f.StringVar(&k.SharedClaim, "kube-shared-claim", "", "with --executor kubernetes: ReadWriteMany PersistentVolumeClaim mounted at --kube-shared-dir in each pod (the agent's pod mounts it there too); empty: hostPath")
	f.StringVar(&k.NodeSelector, "kube-node-selector", "", "with --executor kubernetes: label selector narrowing the GPU nodes enrolled (e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)")
	f.DurationVar(&k.TimeLimit, "kube-time-limit", 0, "with --executor kubernetes: activeDeadlineSeconds of each run's Job (0: none)")
	f.DurationVar(&k.Refresh, "kube-refresh", 30*time.Second, "with --executor kubernetes: how often nodes are read (a cordoned, NotReady or pressured node stops being certified within one)")
	f.StringVar(&k.RunAs, "kube-run-as", "", `with --executor kubernetes: UID:GID the run and conformance pods run as; "image" keeps the image's user; default the agent's own uid and gid when it is not root (it must be able to delete what runs write), else the image's user`)
	f.StringVar(&k.AgentBinary, "kube-agent-binary", "gpupass-agent", "with --executor kubernetes: gpupass-agent inside --kube-image, which the conformance Job runs")
}
