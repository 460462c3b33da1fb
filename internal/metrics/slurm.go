package metrics

import "strings"

// Slurm names the batch job a run trained in on a Slurm cluster, as the
// broker's run record holds it: compare shows it on the run's line, runs
// and audits carry the same fields.
type Slurm struct {
	Cluster   string `json:"cluster"`
	JobID     string `json:"job_id"`
	Node      string `json:"node"`
	Partition string `json:"partition"`
}

// String is the placement in words:
// "slurm job 12 on n1 (cluster hpc1, partition gpu)".
func (s *Slurm) String() string {
	if s == nil {
		return ""
	}
	msg := "slurm job " + s.JobID
	if s.Node != "" {
		msg += " on " + s.Node
	}
	var where []string
	if s.Cluster != "" {
		where = append(where, "cluster "+s.Cluster)
	}
	if s.Partition != "" {
		where = append(where, "partition "+s.Partition)
	}
	if len(where) > 0 {
		msg += " (" + strings.Join(where, ", ") + ")"
	}
	return msg
}
