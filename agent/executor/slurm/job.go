package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Job is what Slurm says about one job.
type Job struct {
	ID        string `json:"job_id"`
	Name      string `json:"name"`
	State     string `json:"state"`
	Reason    string `json:"reason,omitempty"`
	Node      string `json:"node,omitempty"`
	Partition string `json:"partition,omitempty"`
	// ExitCode and Signal are from ExitCode=CODE:SIGNAL.
	ExitCode  int    `json:"exit_code"`
	Signal    int    `json:"signal,omitempty"`
	TimeLimit string `json:"time_limit,omitempty"`
	Comment   string `json:"comment,omitempty"`
	// UserID is the uid the job runs as (UserId=NAME(UID)); -1 when
	// Slurm did not say.
	UserID int `json:"user_id"`
	// EndTime is when slurmctld saw the job end (whole seconds, its
	// clock); zero while it runs or when Slurm did not say.
	EndTime time.Time `json:"end_time,omitzero"`
	// NodeList is every node the job holds, in Slurm's hostlist form
	// ("n[1-2]"); Node is its batch host.
	NodeList string `json:"node_list,omitempty"`
	// ReqNodeList is the nodes the job was pinned to (sbatch -w), in
	// the same form: where a pending job will run.
	ReqNodeList string `json:"req_node_list,omitempty"`
	// StdErr is the job's stderr file (sbatch --error).
	StdErr string `json:"stderr,omitempty"`
}

// ErrNoJob is a job Slurm no longer (or never) knew.
var ErrNoJob = errors.New("slurm does not know the job")

// showJobs runs `scontrol show job -o [ID]` with its times as Unix
// seconds (SLURM_TIME_FORMAT=%s): the default, the local time without a
// zone, names two instants in the hour a DST change repeats.
func (c *Client) showJobs(ctx context.Context, id ...string) (string, error) {
	return c.run(ctx, append(os.Environ(), "SLURM_TIME_FORMAT=%s"), "scontrol", append([]string{"show", "job", "-o"}, id...)...)
}

// Job reads one job (scontrol show job -o ID).
func (c *Client) Job(ctx context.Context, id string) (Job, error) {
	out, err := c.showJobs(ctx, id)
	if err != nil {
		var te *ToolError
		if errors.As(err, &te) && strings.Contains(te.Stderr, "Invalid job id") {
			return Job{}, fmt.Errorf("job %s: %w", id, ErrNoJob)
		}
		return Job{}, fmt.Errorf("reading slurm job %s: %w", id, err)
	}
	jobs := ParseJobs(out)
	if len(jobs) == 0 {
		return Job{}, fmt.Errorf("job %s: %w", id, ErrNoJob)
	}
	return jobs[0], nil
}

// Jobs returns every job Slurm still knows, of every user, oldest first.
func (c *Client) Jobs(ctx context.Context) ([]Job, error) {
	out, err := c.showJobs(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing slurm jobs: %w", err)
	}
	return ParseJobs(out), nil
}

// JobsNamed returns the jobs Slurm still knows by name, oldest first.
func (c *Client) JobsNamed(ctx context.Context, name string) ([]Job, error) {
	jobs, err := c.Jobs(ctx)
	return slices.DeleteFunc(jobs, func(j Job) bool { return j.Name != name }), err
}

// RunJobsOn returns the jobs of gpupass runs (JobName) running on node,
// or pending for it: a job step asked for on the node now would wait for
// their end. (One completing is over within KillWait, and a step waits
// for it.) Every gpupass job is pinned to its nodes (sbatch -w), so a
// pending one says which it waits for (ReqNodeList): an agent restarted
// just after it submitted one must not queue a measurement behind it,
// and go unheard by the broker meanwhile.
//
// A gang's job holds every node of the gang, its batch host only one of
// them: the others are found in its node list.
func (c *Client) RunJobsOn(ctx context.Context, node string) ([]Job, error) {
	jobs, err := c.Jobs(ctx)
	return runJobsOn(jobs, node, func(list string) []string { return c.hostnames(ctx, list) }), err
}

func runJobsOn(jobs []Job, node string, hostnames func(list string) []string) []Job {
	on := func(list string) bool {
		return list == node || (list != "" && slices.Contains(hostnames(list), node))
	}
	return slices.DeleteFunc(jobs, func(j Job) bool {
		if !strings.HasPrefix(j.Name, JobName("")) {
			return true
		}
		switch j.baseState() {
		case "RUNNING", "CONFIGURING":
			if j.Node == node || j.NodeList == node {
				return false
			}
			return j.NodeList == "" || j.NodeList == j.Node || !on(j.NodeList)
		case "PENDING":
			return !on(j.ReqNodeList)
		}
		return true
	})
}

// hostnames expands a Slurm hostlist ("n[1-2],gpu07") with scontrol,
// whose rules it is; none when scontrol cannot.
func (c *Client) hostnames(ctx context.Context, list string) []string {
	out, err := c.run(ctx, nil, "scontrol", "show", "hostnames", list)
	if err != nil {
		return nil
	}
	return strings.Fields(out)
}

// ParseJobs parses `scontrol show job -o` with SLURM_TIME_FORMAT=%s.
func ParseJobs(out string) []Job {
	var jobs []Job
	for _, line := range strings.Split(out, "\n") {
		f := fields(line)
		if f["JobId"] == "" {
			continue
		}
		j := Job{ID: f["JobId"], Name: f["JobName"], State: f["JobState"], Reason: f["Reason"], Partition: f["Partition"], TimeLimit: f["TimeLimit"], Comment: f["Comment"]}
		if j.Reason == "None" {
			j.Reason = ""
		}
		if n := f["NodeList"]; n != "(null)" {
			j.NodeList = n
		}
		if n := f["ReqNodeList"]; n != "(null)" {
			j.ReqNodeList = n
		}
		if n := f["BatchHost"]; n != "" && n != "(null)" {
			j.Node = n
		} else {
			j.Node = j.NodeList
		}
		j.StdErr = f["StdErr"]
		j.UserID = -1
		if _, uid, ok := strings.Cut(f["UserId"], "("); ok {
			if n, err := strconv.Atoi(strings.TrimSuffix(uid, ")")); err == nil {
				j.UserID = n
			}
		}
		// Unix seconds (showJobs); "Unknown" or "None" while the job
		// runs, and a running job's is its projected end.
		if sec, err := strconv.ParseInt(f["EndTime"], 10, 64); err == nil && sec > 0 && j.Phase() == Ended {
			j.EndTime = time.Unix(sec, 0)
		}
		code, sig, _ := strings.Cut(f["ExitCode"], ":")
		j.ExitCode, _ = strconv.Atoi(code)
		j.Signal, _ = strconv.Atoi(sig)
		jobs = append(jobs, j)
	}
	return jobs
}

// Phase is where a job is in its life, in gpupass's terms.
type Phase int

// Phases.
const (
	Pending Phase = iota
	Running
	Ended
)

// Phase maps the job's state. States Slurm may add later count as
// running until they end: following a job a little longer is harmless,
// calling it ended early loses its output.
func (j Job) Phase() Phase {
	switch j.baseState() {
	case "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING":
		return Pending
	case "COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "CANCELLED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED":
		return Ended
	}
	return Running
}

func (j Job) baseState() string {
	s, _, _ := strings.Cut(j.State, " ") // "CANCELLED by 0" (sacct)
	return s
}

// NodeLost says the job ended because of its node, not its code: the run
// is re-placed like one whose node was lost.
func (j Job) NodeLost() bool {
	switch j.baseState() {
	case "NODE_FAIL", "PREEMPTED", "BOOT_FAIL":
		return true
	}
	return false
}

// Describe is the job's state in words, with Slurm's reason:
// "slurm job 12 on n1 (partition gpu): TIMEOUT (TimeLimit, limit 00:01:00)".
func (j Job) Describe() string {
	msg := fmt.Sprintf("slurm job %s", j.ID)
	if j.Node != "" {
		msg += " on " + j.Node
	}
	if j.Partition != "" {
		msg += " (partition " + j.Partition + ")"
	}
	msg += ": " + j.State
	var why []string
	if j.Reason != "" {
		why = append(why, j.Reason)
	}
	switch j.baseState() {
	case "FAILED", "COMPLETED", "OUT_OF_MEMORY":
		why = append(why, "exit code "+strconv.Itoa(j.ExitCode))
		if j.Signal != 0 {
			why = append(why, "signal "+strconv.Itoa(j.Signal))
		}
	case "TIMEOUT":
		if j.TimeLimit != "" {
			why = append(why, "time limit "+j.TimeLimit)
		}
	}
	if len(why) > 0 {
		msg += " (" + strings.Join(why, ", ") + ")"
	}
	return msg
}

// Cancel cancels every job of this user with the given name.
func (c *Client) Cancel(ctx context.Context, name string) error {
	if _, err := c.run(ctx, nil, "scancel", "--name", name); err != nil {
		return fmt.Errorf("cancelling slurm jobs named %s: %w", name, err)
	}
	return nil
}
