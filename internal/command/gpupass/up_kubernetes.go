package gpupass

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// UpKube are up's flags for a Kubernetes cluster: with --executor
// kubernetes each region's agent is a gpupass-agent --executor kubernetes
// that stands for the cluster's GPU nodes (KUBECONFIG, e.g. the one
// scripts/k8s-up.sh prints, names the cluster) and runs jobs as Jobs in
// --kube-image, so that validate, train and compare run through it.
type UpKube struct {
	Kubeconfig string
	Namespace  string
	Image      string
	SharedDir  string
}

// AddFlags registers the flags.
func (k *UpKube) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&k.Kubeconfig, "kubeconfig", "", "with --executor kubernetes: the cluster's kubeconfig (default $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&k.Namespace, "kube-namespace", "default", "with --executor kubernetes: namespace of the runs' and conformance checks' Jobs (it must exist)")
	f.StringVar(&k.Image, "kube-image", "", "with --executor kubernetes: the runs' image, pinned by digest (NAME@sha256:…), already on the nodes or pullable there")
	f.StringVar(&k.SharedDir, "kube-shared-dir", "", "with --executor kubernetes: absolute directory this machine and the pods see at the same path, a hostPath on the node (default STATE_DIR/kube-shared; right for scripts/k8s-up.sh's one-node cluster on this machine)")
}

// validate checks the flags against the executor; stateDir gives the
// shared dir's default.
func (k *UpKube) validate(executor string, agentsPerRegion int, stateDir string) error {
	if executor != "kubernetes" {
		if k.Kubeconfig != "" || k.Image != "" || k.SharedDir != "" {
			return errors.New("--kubeconfig, --kube-image and --kube-shared-dir need --executor kubernetes")
		}
		return nil
	}
	if k.Image == "" {
		return errors.New("--kube-image is required with --executor kubernetes: the runs' image, pinned by digest (NAME@sha256:…); on the local cluster, `sudo scripts/k8s-up.sh --run-image` builds one and prints the up line that uses it")
	}
	if !strings.Contains(k.Image, "@sha256:") {
		return fmt.Errorf("--kube-image %q: pin it by digest (NAME@sha256:…): the certified environment is the node and this image", k.Image)
	}
	if k.SharedDir == "" {
		abs, err := filepath.Abs(filepath.Join(stateDir, "kube-shared"))
		if err != nil {
			return fmt.Errorf("--state-dir %q: %w", stateDir, err)
		}
		k.SharedDir = abs
	}
	if !filepath.IsAbs(k.SharedDir) {
		return fmt.Errorf("--kube-shared-dir %q: give an absolute directory this machine and the pods see at the same path", k.SharedDir)
	}
	if agentsPerRegion != 1 {
		return fmt.Errorf("--agents-per-region %d: with --executor kubernetes each region has one agent, which stands for every GPU node", agentsPerRegion)
	}
	return nil
}

// args are the agents' Kubernetes arguments (none without --executor
// kubernetes); the agent places each region's work (--stack-dir). A
// local stack's agents read the cluster's nodes every 5s.
func (k *UpKube) args(executor string) []string {
	if executor != "kubernetes" {
		return nil
	}
	args := []string{"--kube-shared-dir", k.SharedDir, "--kube-image", k.Image, "--kube-namespace", k.Namespace, "--kube-refresh", "5s"}
	if k.Kubeconfig != "" {
		args = append(args, "--kubeconfig", k.Kubeconfig)
	}
	return args
}
