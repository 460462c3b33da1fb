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
	f.StringVar(&s.Executor, "executor", "local", "how the agents run jobs: local (simulated nodes on this machine) or slurm (the compute nodes of a Slurm cluster, found through SLURM_CONF)")
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
	default:
		return fmt.Errorf("--executor %q: use local or slurm", s.Executor)
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

// agentArgs is the argv of the agent named name in region.
func (o *UpOptions) agentArgs(url, region, name, stateDir string) ([]string, error) {
	args := []string{"--broker-url", url, "--region", region, "--state-dir", stateDir, "--python", o.Python, "--read-probe-mb", "8",
		"--price-per-hour", "2.5", "--storage-class", "standard", "--bandwidth-gbps", "25"}
	if o.Slurm.Executor != "slurm" {
		return append(args, "--executor", "local", "--provider", "local", "--zone", region+"a", "--hostname", name,
			"--simulate", o.Profile, "--query-addr", "127.0.0.1:0"), nil
	}
	// Each region's agent keeps its runs and its facts in a dir of its
	// own: the compute nodes are the same.
	shared := filepath.Join(o.Slurm.SharedDir, "up-"+region)
	if err := os.MkdirAll(shared, 0o755); err != nil {
		return nil, fmt.Errorf("--slurm-shared-dir: %w", err)
	}
	args = append(args, "--executor", "slurm", "--slurm-shared-dir", shared)
	for _, p := range o.Slurm.Partitions {
		args = append(args, "--slurm-partition", p)
	}
	if o.Profile != "" {
		// --profile "" measures the compute nodes' own GPUs.
		args = append(args, "--simulate", o.Profile)
	}
	return args, nil
}
