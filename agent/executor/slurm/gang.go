package slurm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// A run across several nodes of the cluster (a gang) is one batch job:
// `sbatch -N n -w NODE0,NODE1,…` whose script runs the command under
// `srun -N n --ntasks-per-node=1 --kill-on-bad-exit=1`, each task wrapped
// by rendezvous.SlurmTask. The broker leases every rank at once, so each
// node's agent receives its rank's assignment at about the same time;
// each runs its rank's checks on its own node, then its Runner joins the
// gang in the cluster's gangHub. Rank 0's runner submits the job once
// every rank has joined; every rank's runner follows the one job and its
// own output files: the task on a rank's node cds into that rank's work
// dir, writes to that rank's attempt files and gets that rank's
// environment (its allocation, metrics file, and the broker's rendezvous
// variables, so RANK is the broker's rank). A task that fails ends the
// job (--kill-on-bad-exit), srun names it in the job's stderr (rank 0's
// log), and that rank's run fails naming it; the others end stopped with
// it. Cancelling any rank scancels the one job; the time limit is the
// job's.
//
// The job outlives the agent. Rank 0 records it in the ledger for every
// rank's attempt, so an agent restarted under the gang (a.From set)
// finds it again from each rank on its own, follows each rank's files on
// from where its spool ends, and never submits a job for a rank: no
// rank waits for another, whichever of their agents comes back first.

// gangJoinTimeout bounds how long rank 0 waits for the other ranks'
// assignments (each runs its checks on its node first).
const gangJoinTimeout = 10 * time.Minute

// gangPeerWait bounds how long a rank stopped by another rank's failure
// waits for the broker's cancel before it reports, so that the rank that
// failed is reported first and the run names it.
const gangPeerWait = 15 * time.Second

// gangInfo is a rank's place in its gang, from its attempt's environment
// (the agent's run loop checked it: rendezvous.Gang.Validate).
type gangInfo struct {
	run         string
	rank, nodes int
	port        int
}

// gangOf reads the attempt's gang; nil for a run on one node.
func gangOf(env []string) (*gangInfo, error) {
	nn := executor.EnvValue(env, "GPUPASS_NNODES")
	if nn == "" || nn == "1" {
		return nil, nil
	}
	var g gangInfo
	var errs []error
	atoi := func(name string) int {
		n, err := strconv.Atoi(executor.EnvValue(env, name))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		return n
	}
	g.nodes, g.rank, g.port = atoi("GPUPASS_NNODES"), atoi("GPUPASS_NODE_RANK"), atoi("GPUPASS_MASTER_PORT")
	if g.run = executor.EnvValue(env, executor.EnvGangRun); g.run == "" {
		errs = append(errs, errors.New("no "+executor.EnvGangRun))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("the attempt's rendezvous: %w", err)
	}
	return &g, nil
}

// refuse says why the runner cannot run this rank. A rank with a uid
// of its own (the agent's run-as user) is taken: whether every rank has
// the same one, which the one batch job needs, is known only once every
// rank joined (gangJob.oneUser).
func (g gangInfo) refuse(a executor.Attempt, hub *gangHub) error {
	if hub == nil {
		return errors.New("this runner takes no rank of a run across several nodes (no gang hub)")
	}
	return nil
}

// oneUser says why the gang's one batch job cannot run every rank: its
// ranks run as different users. The job (sbatch -N n) runs every rank's
// task as the one uid it was submitted as, so a rank whose node holds
// another uid would run as another rank's, in a work dir handed to its
// own. The agent gives a gang's ranks one uid of its run-as range
// (UIDRange.AcquireShared); this is the check that they got it.
func (gj *gangJob) oneUser() error {
	who := func(c *syscall.Credential) string {
		if c == nil {
			return "the agent's own user"
		}
		return fmt.Sprintf("uid %d (gid %d)", c.Uid, c.Gid)
	}
	first := gj.ranks[0].a.Credential
	for rank := 1; rank < gj.nodes; rank++ {
		c := gj.ranks[rank].a.Credential
		same := (c == nil) == (first == nil)
		if same && c != nil {
			same = c.Uid == first.Uid && c.Gid == first.Gid && slices.Equal(c.Groups, first.Groups)
		}
		if !same {
			return fmt.Errorf("the gang's ranks run as different users (rank 0 as %s, rank %d as %s), and a run across several slurm nodes is one batch job (sbatch -N %d) that runs every rank as one uid: not submitted",
				who(first), rank, who(c), gj.nodes)
		}
	}
	return nil
}

// gangHub is where the ranks of the cluster's gangs meet.
type gangHub struct {
	mu    sync.Mutex
	gangs map[string]*gangJob
}

func newGangHub() *gangHub { return &gangHub{gangs: map[string]*gangJob{}} }

// gangJob is one attempt of a gang.
type gangJob struct {
	nodes int
	// ranks are the ranks that joined, by rank; all is closed once
	// every rank did.
	ranks map[int]gangRank
	all   chan struct{}
	// done is closed once rank 0 submitted the job (jobID) or gave up
	// (err).
	done  chan struct{}
	jobID string
	err   error
	// ended is closed once the rank srun named as failed returned.
	ended chan struct{}
	once  sync.Once
}

// gangRank is one rank's part of the job.
type gangRank struct {
	node string
	a    executor.Attempt
	// base is the rank's attempt files less their extension.
	base string
}

// join adds rank to the gang key (run and attempt) of nodes ranks.
func (h *gangHub) join(key string, nodes, rank int, r gangRank) (*gangJob, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.gangs[key]
	if g == nil {
		g = &gangJob{nodes: nodes, ranks: map[int]gangRank{}, all: make(chan struct{}), done: make(chan struct{}), ended: make(chan struct{})}
		h.gangs[key] = g
	}
	if g.nodes != nodes {
		return nil, fmt.Errorf("rank %d of %s says %d nodes, rank(s) before it %d", rank, key, nodes, g.nodes)
	}
	if _, dup := g.ranks[rank]; dup {
		return nil, fmt.Errorf("rank %d of %s joined twice", rank, key)
	}
	g.ranks[rank] = r
	if len(g.ranks) == nodes {
		close(g.all)
	}
	return g, nil
}

func (h *gangHub) leave(key string) {
	h.mu.Lock()
	delete(h.gangs, key)
	h.mu.Unlock()
}

func (g *gangJob) submitted(id string, err error) {
	g.jobID, g.err = id, err
	close(g.done)
}

// runGang runs rank g.rank of a gang: rank 0 submits the one job once
// every rank joined, each rank follows it.
func (r *Runner) runGang(ctx context.Context, a executor.Attempt, f *follower, g gangInfo) executor.Exit {
	if r.OnGang != nil {
		r.OnGang(f.alloc, g.run)
	}
	if a.From != nil {
		return r.followGang(ctx, a, f, g)
	}
	key := g.run + "/" + f.attempt
	gj, err := r.Gangs.join(key, g.nodes, g.rank, gangRank{node: r.Node, a: a, base: f.base})
	if err != nil {
		return startErr(err)
	}
	stopped := func(why string) executor.Exit {
		return executor.Exit{Code: -1, Stopped: true, Reason: why}
	}
	if g.rank == 0 {
		defer r.Gangs.leave(key)
		t := time.NewTimer(gangJoinTimeout)
		defer t.Stop()
		select {
		case <-gj.all:
		case <-ctx.Done():
			gj.submitted("", errors.New("rank 0 was stopped before every rank's assignment arrived"))
			return stopped("stopped before every rank's assignment arrived")
		case <-t.C:
			err := fmt.Errorf("only %d of %d ranks' assignments arrived within %s", len(gj.ranks), g.nodes, gangJoinTimeout)
			gj.submitted("", err)
			return startErr(err)
		}
		err := gj.oneUser()
		var body string
		var place []string
		if err == nil {
			body, place, err = gangScript(a, gj, r.Node)
		}
		if err == nil {
			var id string
			var refused bool
			id, refused, err = r.submitScript(ctx, a, f.alloc, f.attempt, f.base, f.noteStrays, place, body, otherRanks(gj))
			if err != nil {
				gj.submitted("", err)
				ex := startErr(err)
				ex.LaunchFailed = refused
				return ex
			}
			f.st.JobID = id
		}
		gj.submitted(f.st.JobID, err)
		if err != nil {
			return startErr(err)
		}
		_ = f.files.Save()
	} else {
		select {
		case <-gj.done:
		case <-ctx.Done():
			return stopped("stopped before rank 0 submitted the gang's job")
		}
		if gj.err != nil {
			return startErr(fmt.Errorf("rank 0 did not submit the gang's job: %w", gj.err))
		}
		f.st.JobID = gj.jobID
	}
	if f.note != nil {
		f.note(fmt.Sprintf("rank %d of %d: slurm job %s runs every rank (srun -N %d), this rank's task on %s", g.rank, g.nodes, f.st.JobID, g.nodes, r.Node),
			map[string]string{"slurm_job_id": f.st.JobID, "slurm_node": r.Node, "gang_rank": strconv.Itoa(g.rank)})
	}
	return r.followTasks(ctx, a, f, g.rank, gj.ranks[0].base+".err", gj)
}

// followGang follows a rank on after the agent restarted under the
// gang's job: the ledger holds the job for each rank's attempt.
func (r *Runner) followGang(ctx context.Context, a executor.Attempt, f *follower, g gangInfo) executor.Exit {
	if f.st.JobID == "" {
		return startErr(fmt.Errorf("rank %d of %d: the gang's slurm job (attempt %s of run %s) is not in the agent's ledger, so it is not followed on (its end was read already, or it was never recorded); a rank never submits a job of its own after an agent restart",
			g.rank, g.nodes, f.attempt, g.run))
	}
	if f.note != nil {
		f.note(fmt.Sprintf("rank %d of %d: following slurm job %s on after the agent restarted, this rank's task on %s", g.rank, g.nodes, f.st.JobID, r.Node),
			map[string]string{"slurm_job_id": f.st.JobID, "slurm_node": r.Node, "gang_rank": strconv.Itoa(g.rank)})
	}
	// The job's stderr file (rank 0's) is where srun names a failed
	// task: Slurm says where it is, as the job was submitted.
	return r.followTasks(ctx, a, f, g.rank, "", nil)
}

// otherRanks are the allocations of the gang's ranks but rank 0.
func otherRanks(gj *gangJob) []string {
	var ids []string
	for rank := 1; rank < gj.nodes; rank++ {
		ids = append(ids, executor.EnvValue(gj.ranks[rank].a.Env, executor.EnvAllocID))
	}
	return ids
}

// followTasks follows the gang's job to its end, and names the rank
// whose task failed: errFile is the job's stderr file ("": the one
// Slurm names), gj the gang as its ranks joined (nil when followed on
// after an agent restart).
func (r *Runner) followTasks(ctx context.Context, a executor.Attempt, f *follower, rank int, errFile string, gj *gangJob) executor.Exit {
	f.link = executor.NewLinkWatch(a.Link, f.base, func(msg string) {
		if f.note != nil {
			f.note(msg, map[string]string{"slurm_job_id": f.st.JobID, "gang_rank": strconv.Itoa(rank)})
		}
	})
	if f.link != nil {
		// The step writes its result as the job's user.
		f.link.Owner = ownerOf(a)
	}
	ex := f.run(ctx, a.Grace)
	if err := f.link.Finish(ex.Reason); err != nil {
		// --require-bandwidth: the step ended the job before the
		// command, and the run says both figures.
		ex.Reason = events.Outcome(err.Error(), ex.Reason)
		if ex.Code == 0 {
			ex.Code = 3
		}
	}
	if ex.Code == 0 && ex.StartErr == nil {
		return ex
	}
	if errFile == "" {
		errFile = f.last.StdErr
	}
	// srun numbers tasks in Slurm's node order, not the broker's ranks:
	// the node says which rank it was.
	node, _, what := failedTask(errFile, ownerOf(a))
	if node == "" {
		return ex
	}
	// ended is closed once the rank that failed reported (nil: no
	// other rank of this process tells).
	var ended chan struct{}
	if gj != nil {
		ended = gj.ended
	}
	if node == r.Node {
		if gj != nil {
			defer gj.once.Do(func() { close(gj.ended) })
		}
		ex.Reason = fmt.Sprintf("its task on slurm node %s: %s (%s)", node, what, ex.Reason)
		if code, ok := strings.CutPrefix(what, "Exited with exit code "); ok {
			if n, err := strconv.Atoi(code); err == nil {
				ex.Code = n
			}
		}
		return ex
	}
	// Stopped with the gang: the rank that failed reports first, and
	// the broker, naming it, asks this rank to stop.
	t := time.NewTimer(gangPeerWait)
	defer t.Stop()
	select {
	case <-ended:
		select {
		case <-ctx.Done():
			ex.Stopped = true
		case <-t.C:
		}
	case <-ctx.Done():
		ex.Stopped = true
	case <-t.C:
	}
	ex.Reason = fmt.Sprintf("ended with the gang: the task on slurm node %s: %s (%s)", node, what, ex.Reason)
	return ex
}

// RunsGangAsOneJob implements executor.OneJobGangs: a gang's ranks on
// the cluster's nodes are one batch job, every task as its one uid.
func (r *Runner) RunsGangAsOneJob() bool { return r.Gangs != nil }

// RunsLinkStep says a gang rank's link step (executor.Attempt.Link)
// runs in the gang's job, on the rank's node: gangScript puts it
// before the command.
func (r *Runner) RunsLinkStep() bool { return true }

// srunTaskError is srun's line for a task that ended badly: "srun:
// error: n2: task 1: Exited with exit code 3", "… task 1: Killed".
var srunTaskError = regexp.MustCompile(`(?m)^srun: error: ([^: ]+): tasks? ([0-9,-]+): (.+)$`)

// maxErrTail is how much of the job's stderr file's end failedTask
// reads for srun's line.
const maxErrTail = 1 << 20

// failedTask is the first task srun said ended badly in the job's
// stderr file, its node and what happened; "" when it named none. The
// file is the job's to write: read as owner's (nil: the agent's own
// user's) regular file, never through a link, and only its end.
func failedTask(errFile string, owner *executor.RunAs) (node, task, what string) {
	f, fi, err := owner.OpenJobFile(errFile)
	if err != nil {
		return "", "", ""
	}
	defer f.Close()
	if n := fi.Size(); n > maxErrTail {
		if _, err := f.Seek(n-maxErrTail, io.SeekStart); err != nil {
			return "", "", ""
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, maxErrTail))
	if err != nil {
		return "", "", ""
	}
	m := srunTaskError.FindSubmatch(b)
	if m == nil {
		return "", "", ""
	}
	return string(m[1]), string(m[2]), strings.TrimSpace(string(m[3]))
}

// envName is a variable the task script may export.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// gangScript is the gang's batch script and sbatch's placement for it:
// the ranks' nodes in rank order, one task each.
func gangScript(a executor.Attempt, gj *gangJob, node0 string) (string, []string, error) {
	if len(a.Command) == 0 {
		return "", nil, errors.New("the attempt has no command")
	}
	nodes := make([]string, gj.nodes)
	var c strings.Builder
	c.WriteString("case \"$SLURMD_NODENAME\" in\n")
	base := envMap(a.Env)
	rdv := append(rendezvous.Names(), executor.EnvGangRun)
	for rank := 0; rank < gj.nodes; rank++ {
		r := gj.ranks[rank]
		nodes[rank] = r.node
		if slices.Index(nodes[:rank], r.node) >= 0 {
			return "", nil, fmt.Errorf("ranks of the gang share slurm node %s: one rank per node", r.node)
		}
		fmt.Fprintf(&c, "%s)\n  cd %s || exit 127\n  exec >>%s 2>>%s\n", shellQuote(r.node), shellQuote(r.a.Dir), shellQuote(r.base+".out"), shellQuote(r.base+".err"))
		own := envMap(r.a.Env)
		var keys []string
		for k, v := range own {
			if bv, ok := base[k]; !ok || bv != v || slices.Contains(rdv, k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !envName.MatchString(k) {
				return "", nil, fmt.Errorf("rank %d's environment has %.60q, which is no variable name", rank, k)
			}
			fmt.Fprintf(&c, "  %s=%s; export %s\n", k, shellQuote(own[k]), k)
		}
		var gone []string
		for k := range base {
			if _, ok := own[k]; !ok && envName.MatchString(k) {
				gone = append(gone, k)
			}
		}
		slices.Sort(gone)
		for _, k := range gone {
			fmt.Fprintf(&c, "  unset %s\n", k)
		}
		if r.a.Link != nil {
			// The link, measured by the ranks themselves at the
			// gang's rendezvous: by the command's own Python once it
			// imported torch, or by a step before the command.
			if argv, ok := r.a.Link.InCommand(r.base, a.Command); ok {
				c.WriteString("  exec" + shellWords(argv) + "\n")
			} else {
				c.WriteString(r.a.Link.Shell(r.base, shellQuote))
			}
		}
		c.WriteString("  ;;\n")
	}
	c.WriteString("*)\n  echo \"gpupass: slurm node $SLURMD_NODENAME runs no rank of this run\" >&2\n  exit 127\n  ;;\nesac\nexec \"$@\"\n")
	if nodes[0] != node0 {
		return "", nil, fmt.Errorf("rank 0 is on %s, not on this runner's node %s", nodes[0], node0)
	}
	port, err := strconv.Atoi(executor.EnvValue(a.Env, "GPUPASS_MASTER_PORT"))
	if err != nil {
		return "", nil, fmt.Errorf("the attempt's GPUPASS_MASTER_PORT: %w", err)
	}
	task, err := rendezvous.SlurmTask(port, append([]string{"/bin/sh", "-c", c.String(), "gpupass-node"}, a.Command...))
	if err != nil {
		return "", nil, err
	}
	n := strconv.Itoa(gj.nodes)
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# written by gpupass-agent: one attempt of a run across " + n + " nodes, one task each\n")
	fmt.Fprintf(&b, "cd %s || exit 127\nexec srun -N %s --ntasks-per-node=1 --kill-on-bad-exit=1 --input=none%s\n", shellQuote(a.Dir), n, shellWords(task))
	return b.String(), []string{"-w", strings.Join(nodes, ","), "-N" + n, "--ntasks-per-node=1"}, nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
