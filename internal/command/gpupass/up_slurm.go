package gpupass

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// UpSlurm are up's flags for a Slurm cluster: with --executor slurm each
// region's agent is a gpupass-agent --executor slurm that stands for the
// partitions' compute nodes (SLURM_CONF, from the environment, names the
// cluster), so that validate, train and compare run through Slurm.
type UpSlurm struct {
	Executor   string
	Partitions []string
	SharedDir  string
}

// AddFlags registers the flags.
func (s *UpSlurm) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.Executor, "executor", "local", "how the agents run jobs: local (simulated nodes on this machine), slurm (the compute nodes of a Slurm cluster, found through SLURM_CONF), kubernetes (Jobs on a cluster's GPU nodes, found through KUBECONFIG; see --kube-*) or another executor the agent has (gpupass-agent executors lists them; its settings from GPUPASS_* in the environment)")
	f.StringArrayVar(&s.Partitions, "slurm-partition", nil, "with --executor slurm: partition whose compute nodes the agents stand for (repeatable; default all)")
	f.StringVar(&s.SharedDir, "slurm-shared-dir", "", "with --executor slurm: absolute directory this machine and every compute node see (runs' work dirs and output)")
}

// validate checks the flags; agents-per-region must be 1 with slurm (two
// agents of one region would enroll every compute node twice).
func (s *UpSlurm) validate(agentsPerRegion int) error {
	switch s.Executor {
	case "", "local":
		if len(s.Partitions) > 0 || s.SharedDir != "" {
			return errors.New("--slurm-partition and --slurm-shared-dir need --executor slurm")
		}
		return nil
	case "slurm":
	case "kubernetes":
		if len(s.Partitions) > 0 || s.SharedDir != "" {
			return errors.New("--slurm-partition and --slurm-shared-dir need --executor slurm")
		}
		return nil // UpKube.validate
	default:
		// Another executor of the agent's (checked against
		// gpupass-agent executors as the stack starts).
		if len(s.Partitions) > 0 || s.SharedDir != "" {
			return errors.New("--slurm-partition and --slurm-shared-dir need --executor slurm")
		}
		return nil
	}
	if s.SharedDir == "" || !filepath.IsAbs(s.SharedDir) {
		return fmt.Errorf("--slurm-shared-dir %q: give an absolute directory that every compute node sees", s.SharedDir)
	}
	if st, err := os.Stat(s.SharedDir); err != nil || !st.IsDir() {
		return fmt.Errorf("--slurm-shared-dir %s: not a directory here", s.SharedDir)
	}
	if agentsPerRegion != 1 {
		return fmt.Errorf("--agents-per-region %d: with --executor slurm each region has one agent, which stands for every compute node", agentsPerRegion)
	}
	return nil
}

// args are the agents' Slurm arguments (none without --executor slurm);
// the agent places each region's work (--stack-dir).
func (s *UpSlurm) args() []string {
	if s.Executor != "slurm" {
		return nil
	}
	args := []string{"--slurm-shared-dir", s.SharedDir}
	for _, p := range s.Partitions {
		args = append(args, "--slurm-partition", p)
	}
	return args
}
