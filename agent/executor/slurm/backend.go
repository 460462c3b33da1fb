package slurm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/probe"
)

// Name is --executor slurm.
const Name = "slurm"

// Fields of the errors the backend returns (Backend.FlagNames).
const (
	FieldSharedDir   = "slurm shared dir"
	FieldRefresh     = "slurm refresh"
	FieldAgentBinary = "slurm agent binary"
	FieldSimulate    = "slurm simulated node"
	FieldLedgerDir   = "slurm ledger dir"
)

// Flags configure --executor slurm: the agent runs where Slurm's
// client tools work (a login node, as an unprivileged service account)
// and stands for each compute node of the partitions, one broker node
// each.
type Flags struct {
	Partitions []string
	// SharedDir is seen by the login node and every compute node: the
	// runs' work dirs, output and metrics files live there.
	SharedDir string
	TimeLimit time.Duration
	// Refresh is how often the partitions are read again; a node Slurm
	// takes out (drain, down, fail, maintenance) stops being certified
	// within one.
	Refresh time.Duration
	// AgentBinary is the gpupass-agent the conformance job step runs on
	// the compute node (it must be at that path there too).
	AgentBinary string
	// LedgerDir is where the agent records each job it submits (default
	// --state-dir/slurm/ledger): on the login node, where no job writes.
	// Every job of the account it does not hold is cancelled, so all the
	// agents of one account share it (Ledger).
	LedgerDir string
	// Simulate is --slurm-simulate: NODE=PROFILE, a simulated hardware
	// profile for one compute node.
	Simulate []string
}

// Backend is the Slurm executor (agent.Backend): the agent runs where
// Slurm's client tools work and stands for each compute node of the
// partitions.
func Backend() agent.Backend {
	return agent.Define(agent.Spec[Flags]{
		About: agent.About{Executor: Name, Help: "batch jobs on a Slurm cluster's compute nodes, each enrolled as a node of its own; see --slurm-*"},
		Bind:  bind,
		Fields: map[string]string{
			FieldSharedDir:   "--slurm-shared-dir",
			FieldRefresh:     "--slurm-refresh",
			FieldAgentBinary: "--slurm-agent-binary",
			FieldSimulate:    "--slurm-simulate",
			FieldLedgerDir:   "--slurm-ledger-dir",
		},
		// Why root and not the cluster's SlurmUser, which Slurm also lets
		// submit as another uid.
		Root:      "on the login node: Slurm lets only root or its SlurmUser submit a job as another uid (sbatch --uid), and the agent hands each run's dir in the shared dir to the run's uid, which only root may",
		Stack:     inStack,
		StandsFor: "every compute node",
		Run:       Run,
	})
}

func bind(f agent.FlagSet, s *Flags) {
	f.StringSliceVar(&s.Simulate, "slurm-simulate", nil, "with --executor slurm: NODE=PROFILE, a simulated hardware profile for one compute node (repeatable; --simulate applies to the others)")
	f.StringSliceVar(&s.Partitions, "slurm-partition", nil, "with --executor slurm: partition whose compute nodes the agent enrolls (repeatable; default: every partition)")
	f.StringVar(&s.SharedDir, "slurm-shared-dir", "", "with --executor slurm: directory the login node and every compute node see (runs' work dirs, output and metrics files)")
	f.DurationVar(&s.TimeLimit, "slurm-time-limit", 0, "with --executor slurm: sbatch --time of each run's job, rounded up to minutes (0: the partition's limit)")
	f.DurationVar(&s.Refresh, "slurm-refresh", 30*time.Second, "with --executor slurm: how often node states are read from Slurm (a drained node stops being certified within one)")
	f.StringVar(&s.LedgerDir, "slurm-ledger-dir", "", "with --executor slurm: directory on the login node, which no compute node mounts, where the agent records each job it submits; every other job of its account is cancelled, so agents sharing one account must share it (default: --state-dir/slurm/ledger)")
	f.StringVar(&s.AgentBinary, "slurm-agent-binary", "", "with --executor slurm: gpupass-agent binary the conformance job step runs on each compute node (default: this one; it must be at the same path there)")
}

// inStack (agent.Regional): each region's agent of a gpupass up stack
// works under a dir of its own in the shared dir, and all of them share
// one ledger in the stack's dir: they submit as one account, and each
// would cancel the others' jobs as strays.
//
// The shared dir itself must be there, seen by every compute node: a
// mistyped one would otherwise be made here, where no node sees it.
func inStack(s *Flags, stackDir, region string) error {
	if err := checkShared(s.SharedDir); err != nil {
		return err
	}
	if s.SharedDir = agent.InRegion(s.SharedDir, region); s.SharedDir != "" {
		if err := os.MkdirAll(s.SharedDir, 0o755); err != nil {
			return fielderr.New(FieldSharedDir, s.SharedDir, "%w", err)
		}
	}
	if s.LedgerDir == "" {
		s.LedgerDir = filepath.Join(stackDir, "slurm-ledger")
	}
	return nil
}

// checkShared refuses a shared dir that is not an absolute directory
// here.
func checkShared(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return fielderr.New(FieldSharedDir, dir, "give an absolute directory every compute node sees")
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fielderr.New(FieldSharedDir, dir, "not a directory here (%v)", err)
	}
	return nil
}

func validate(o *agent.Options, s *Flags) error {
	if err := checkShared(s.SharedDir); err != nil {
		return err
	}
	if s.Refresh < time.Second {
		return fielderr.New(FieldRefresh, s.Refresh.String(), "must be at least 1s")
	}
	if s.AgentBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fielderr.New(FieldAgentBinary, "", "finding this binary: %w", err)
		}
		s.AgentBinary = exe
	}
	for _, v := range s.Simulate {
		if _, _, ok := strings.Cut(v, "="); !ok {
			return fielderr.New(FieldSimulate, v, "want NODE=PROFILE")
		}
	}
	// The state dir (node keys, the default ledger) and the ledger must
	// be out of every job's reach: a job that wrote them could forge the
	// node's measurements or the jobs the agent owns.
	if s.LedgerDir != "" {
		if err := outsideShared(FieldLedgerDir, &s.LedgerDir, s.SharedDir); err != nil {
			return err
		}
	}
	if err := outsideShared(agent.FieldStateDir, &o.StateDir, s.SharedDir); err != nil {
		return err
	}
	if s.LedgerDir == "" {
		s.LedgerDir = filepath.Join(o.StateDir, "slurm", "ledger")
	}
	return checkJobUsers(o.JobUser(), o.JobUIDRange(), o.RunAs, o.RunAsRange)
}

// checkSlurmJobUsers checks what sbatch --uid needs of the job users:
// Slurm submits and runs a job only as a user and group its nodes know
// (sbatch refuses a bare uid: "Invalid --uid specification"). The first
// and last uid of a range are checked here, on the login node; the site
// keeps the accounts the same on every compute node.
func checkJobUsers(runAs *executor.RunAs, rng *local.UIDRange, runAsSpec, rangeSpec string) error {
	var users []*executor.RunAs
	field, spec := executor.FieldRunAs, runAsSpec
	switch {
	case runAs != nil:
		users = []*executor.RunAs{runAs}
	case rng != nil:
		users = []*executor.RunAs{rng.Of(rng.First), rng.Of(rng.Last)}
		field, spec = executor.FieldUIDRange, rangeSpec
	}
	for _, u := range users {
		id := strconv.FormatUint(uint64(u.UID), 10)
		if _, err := user.LookupId(id); err != nil {
			return fielderr.New(field, spec, "uid %d is no account here (%v): Slurm submits a job only as a user its nodes know, so with {%s} slurm each of its uids must be an account on the login node and on every compute node (useradd --no-create-home --uid %d …, or your directory service); give accounts that exist", u.UID, err, agent.FieldExecutor, u.UID)
		}
		if _, err := user.LookupGroupId(strconv.FormatUint(uint64(u.GID), 10)); err != nil {
			return fielderr.New(field, spec, "gid %d is no group here (%v): Slurm runs a job only in a group its nodes know; create the group on the login node and every compute node, or name one after the range (FIRST-LAST:GROUP)", u.GID, err)
		}
	}
	return nil
}

// outsideShared makes *dir absolute and refuses it inside shared.
func outsideShared(field string, dir *string, shared string) error {
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return fielderr.New(field, *dir, "give an absolute directory on the login node: %w", err)
	}
	*dir = abs
	if rel, err := filepath.Rel(shared, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fielderr.New(field, abs, "is inside {"+FieldSharedDir+"}, which every job can write: give a directory on the login node that no compute node mounts")
	}
	return nil
}

// slurmNode is what one compute node's agent needs from the supervisor.
type slurmNode struct {
	client    *Client
	ledger    *Ledger
	cluster   string
	name      string
	partition string
	sharedDir string
	exe       string
	timeLimit time.Duration
	log       *slog.Logger
	// stateDir is the node's own (identity key, reports): its last
	// measurement is kept there for an agent restarted under a run.
	stateDir string

	node agent.Watched[Node]
	// gangs is the cluster's: every node's ranks of a gang meet there.
	gangs *gangHub

	mu sync.Mutex
	// job is the newest batch job seen on the node (one run at a time).
	job Job
	// facts is the node's last successful measurement in this process,
	// made at factsAt (Measure's, which the agent calls one at a time).
	facts   *probe.Facts
	factsAt time.Time
	// rankOf is the node's rank of a gang (its allocation id) and the
	// run whose one job runs it (JobName of that run). Guarded by mu.
	rankOf [2]string
	// reused, when set, says the node's facts are its last measurement,
	// reused while a run's job holds the node (the slurm.node check says
	// so). Guarded by mu.
	reused string
}

// lastFactsFile holds a node's last successful measurement (JSON of
// savedFacts) in its state dir.
const lastFactsFile = "last-facts.json"

type savedFacts struct {
	MeasuredAt time.Time   `json:"measured_at"`
	Facts      probe.Facts `json:"facts"`
}

// lastFacts is the node's last successful measurement: this process's,
// else the one an earlier agent process kept in the state dir.
func (n *slurmNode) lastFacts() (*probe.Facts, time.Time, bool) {
	if n.facts != nil {
		return n.facts, n.factsAt, true
	}
	b, err := os.ReadFile(filepath.Join(n.stateDir, lastFactsFile))
	if err != nil {
		return nil, time.Time{}, false
	}
	var s savedFacts
	if err := json.Unmarshal(b, &s); err != nil {
		n.log.Warn("ignoring the node's saved measurement", "file", lastFactsFile, "err", err)
		return nil, time.Time{}, false
	}
	return &s.Facts, s.MeasuredAt, true
}

func (n *slurmNode) setReused(why string) {
	n.mu.Lock()
	n.reused = why
	n.mu.Unlock()
}

func (n *slurmNode) current() Node { return n.node.Get() }

// Runner runs the node's attempts as batch jobs pinned to it.
func (n *slurmNode) Runner() executor.Runner {
	node := n.current()
	return &Runner{Client: n.client, Cluster: n.cluster, Node: n.name, Gres: node.Gres(), Partition: n.partition, TimeLimit: n.timeLimit,
		Ledger: n.ledger, Gangs: n.gangs, OnGang: func(alloc, run string) {
			n.mu.Lock()
			n.rankOf = [2]string{alloc, run}
			n.mu.Unlock()
		}, OnJob: func(j Job) {
			n.mu.Lock()
			n.job = j
			n.mu.Unlock()
			n.log.Info("slurm job", "job_id", j.ID, "state", j.State, "reason", j.Reason, "node", j.Node, "partition", j.Partition, "cluster", n.cluster)
		}}
}

// gangRun is the run whose one job runs allocID, a rank of a gang on
// this node; "" for none.
func (n *slurmNode) gangRun(allocID string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rankOf[0] == allocID {
		return n.rankOf[1]
	}
	return ""
}

// Placement is where the run's batch job is, once the runner saw it.
func (n *slurmNode) Placement(allocID string) *agent.SlurmPlacement {
	n.mu.Lock()
	j := n.job
	n.mu.Unlock()
	if j.ID == "" || (j.Name != JobName(allocID) && j.Name != JobName(n.gangRun(allocID))) {
		return nil
	}
	p := &agent.SlurmPlacement{Cluster: n.cluster, JobID: j.ID, Node: j.Node, Partition: j.Partition}
	if p.Node == "" || n.gangRun(allocID) != "" {
		// Pending: pinned here (sbatch -w); a rank of a gang: its task
		// runs here, whichever node Slurm names the job's batch host.
		p.Node = n.name
	}
	return p
}

// Orphaned cancels the jobs of a run the agent died under and cannot
// follow on (it died before the run's attempt was marked in its spool,
// see RunLoop.follow): a job nobody follows must not hold the node.
func (n *slurmNode) Orphaned(ctx context.Context, allocID string) string {
	reason := "agent restarted during the run: its slurm job " + JobName(allocID) + " was cancelled"
	if err := n.client.Cancel(ctx, JobName(allocID)); err != nil {
		n.log.Error("cancelling the slurm jobs of a run the agent died under", "alloc", allocID, "err", err)
		reason += " (scancel failed: " + err.Error() + ")"
	}
	if n.ledger != nil {
		n.ledger.ForgetRun(allocID)
	}
	return reason
}

// dir is the node's own dir in the shared dir.
func (n *slurmNode) dir() string { return filepath.Join(n.sharedDir, "gpupass", n.cluster, n.name) }

// WorkRoot is where the node's runs' work dirs go: in the shared dir.
func (n *slurmNode) WorkRoot() string { return filepath.Join(n.dir(), "runs") }

// Measure runs the probes on the compute node as one job step and
// returns what they found; the probes of one suite run share it.
func (n *slurmNode) Measure(ctx context.Context, o *agent.Options) (*probe.Facts, error) {
	if why := n.current().Unavailable(); why != "" {
		// srun would wait for the node as long as Slurm keeps it out.
		n.setReused("")
		return nil, fmt.Errorf("not measured: %s", why)
	}
	// A run's job holds the node when an agent restarted under it (a
	// later suite waits for the run, see RunLoop.Busy): srun would wait
	// for the job's end, and the agent could neither enroll nor follow
	// the run meanwhile. The node is measured again once it ends.
	if jobs, err := n.client.RunJobsOn(ctx, n.name); err != nil {
		return nil, err
	} else if len(jobs) > 0 {
		// An agent restarted under the run (kill -9, an upgrade) would
		// otherwise report the node "not measured" until the run ends:
		// its last measurement is the node as the run found it.
		if f, at, ok := n.lastFacts(); ok {
			n.setReused(fmt.Sprintf("facts measured through srun at %s, reused while the node runs %s; measured again once it ends",
				at.UTC().Format(time.RFC3339), jobs[0].Describe()))
			return f, nil
		}
		n.setReused("")
		return nil, fmt.Errorf("not measured: the node runs %s; measured again once it ends", jobs[0].Describe())
	}
	if err := os.MkdirAll(n.dir(), 0o755); err != nil {
		return nil, fmt.Errorf("making the node's dir in the slurm shared dir: %w", err)
	}
	// srun's job is one of the account's too: held in the ledger while
	// it runs, so that a sweep does not take it for a stray.
	comment, release, err := n.ledger.Hold()
	if err != nil {
		return nil, err
	}
	out, err := n.client.Step(ctx, n.name, n.current().Gres(), comment, nil, agent.RemoteArgs(n.exe, n.dir(), o)...)
	release()
	var f probe.Facts
	if err == nil {
		if jerr := json.Unmarshal([]byte(out), &f); jerr != nil {
			err = fmt.Errorf("reading the conformance step's output on %s: %w", n.name, jerr)
		}
	}
	if err == nil {
		n.facts, n.factsAt = &f, time.Now()
		n.setReused("")
		b, _ := json.Marshal(savedFacts{MeasuredAt: n.factsAt.UTC(), Facts: f})
		if werr := fsutil.WriteFileAtomic(filepath.Join(n.stateDir, lastFactsFile), b, 0o600); werr != nil {
			n.log.Warn("keeping the node's measurement for a restart", "err", werr)
		}
	}
	return &f, err
}

// Suite is the node's conformance suite: every probe runs on the compute
// node, in one srun job step.
func (n *slurmNode) Suite(o *agent.Options) *suite.Suite { return agent.RemoteSuite(n, o) }

func (n *slurmNode) Via() string { return "slurm" }

// JobDir: a Slurm run's work dir is in the shared dir.
func (n *slurmNode) JobDir() string { return n.sharedDir }

// Checks: where and how the node was measured, and its GRES against
// what was measured, before the suite's.
func (n *slurmNode) Checks(f *probe.Facts) (first, last []conformance.Check) {
	return []conformance.Check{n.check(), n.gresCheck(f)}, nil
}

// check is the slurm.node check every report of the node carries: where
// and how it was measured, and whether Slurm runs jobs there.
func (n *slurmNode) check() conformance.Check {
	node := n.current()
	c := conformance.Check{Name: "slurm.node", Expected: "available to jobs",
		Actual: fmt.Sprintf("%s on cluster %s, state %s, measured through srun", n.name, n.cluster, node.State), Status: conformance.Pass}
	n.mu.Lock()
	if n.reused != "" {
		c.Actual += "; " + n.reused
	}
	n.mu.Unlock()
	if why := node.Unavailable(); why != "" {
		c.Status, c.Message = conformance.Fail, why
	}
	return c
}

// Run runs the agent for every compute node of the partitions until
// ctx ends: one broker node per compute node, each with an identity key
// of its own under --state-dir/slurm/CLUSTER-NODE (so its id is stable
// across restarts), provider slurm:CLUSTER, hostname the node's name.
func Run(ctx context.Context, o *agent.Options, s *Flags, log *slog.Logger) error {
	if err := validate(o, s); err != nil {
		return err
	}
	client := &Client{}
	cluster, err := client.ClusterName(ctx)
	if err != nil {
		return err
	}
	ledger := &Ledger{Dir: s.LedgerDir}
	switch {
	case o.JobUIDRange() != nil:
		// Each run's jobs run as a uid of the range: those are the
		// jobs to police, and a uid is handed out again only once
		// every job of it ended.
		r := o.JobUIDRange()
		ledger.Polices = func(uid int) bool { return uid >= int(r.First) && uid <= int(r.Last) }
		r.Guard = UIDGuard{Ledger: ledger, Client: client}
	case o.JobUser() != nil:
		uid := int(o.JobUser().UID)
		ledger.Polices = func(u int) bool { return u == uid }
	}
	if o.JobUser() != nil || o.JobUIDRange() != nil {
		if err := closeRunsParents(s.SharedDir, cluster); err != nil {
			return err
		}
	}
	agents, err := agent.NewClusterAgents(o, Name, cluster, s.Refresh, log)
	if err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		running = map[string]*slurmNode{}
		// gangs joins the ranks of a run across several of the cluster's
		// nodes into one batch job.
		gangs = newGangHub()
	)
	refresh := func() error {
		// Every refresh also ends the jobs of the account that no live
		// run submitted: a job a run's job started lives at most one
		// refresh, even while that run lasts.
		if strays, err := ledger.Sweep(ctx, client, SweepWait); err != nil {
			log.Warn("cancelling slurm jobs of the account that the agent did not submit", "err", err)
		} else if len(strays) > 0 {
			log.Warn("cancelled slurm jobs of the account that the agent did not submit", "jobs", DescribeStrays(strays))
		}
		nodes, err := client.Nodes(ctx, s.Partitions)
		if err != nil {
			return err
		}
		sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
		mu.Lock()
		defer mu.Unlock()
		for _, nd := range nodes {
			if sn, ok := running[nd.Name]; ok {
				sn.node.Set(nd)
				continue
			}
			part := ""
			for _, p := range nd.Partitions {
				if len(s.Partitions) == 0 || slices.Contains(s.Partitions, p) {
					part = p
					break
				}
			}
			sn := &slurmNode{client: client, ledger: ledger, cluster: cluster, name: nd.Name, partition: part, sharedDir: s.SharedDir,
				exe: s.AgentBinary, timeLimit: s.TimeLimit, log: log.With("slurm_node", nd.Name)}
			sn.node.Set(nd)
			sn.stateDir = agents.NodeStateDir(nd.Name)
			sn.gangs = gangs
			if err := agents.StartAt(ctx, nd.Name, nd.Addr, sn.log, sn, simulateFor(o, s, nd.Name)); err != nil {
				return err
			}
			running[nd.Name] = sn
			log.Info("standing for slurm node", "node", nd.Name, "gres", nd.Gres(), "state", nd.State, "reason", nd.Reason, "cluster", cluster, "partition", part)
		}
		return nil
	}
	return agents.Run(ctx, refresh)
}

// closeRunsParents makes the dirs above the runs' own dirs in the shared
// dir (gpupass/CLUSTER, each node's dir and its runs/) the agent's and
// 0755: a run's dir (the executor hands it to the run's uid, 0700) is
// then the only place a run can write, and no run can replace another's
// dir or the dirs on the way to it. A link on the way is refused.
func closeRunsParents(shared, cluster string) error {
	top := filepath.Join(shared, "gpupass")
	if err := os.MkdirAll(filepath.Join(top, cluster), 0o755); err != nil {
		return fmt.Errorf("making the runs' dirs in the shared dir: %w", err)
	}
	var dirs []string
	nodes, _ := os.ReadDir(filepath.Join(top, cluster))
	for _, n := range nodes {
		dirs = append(dirs, filepath.Join(top, cluster, n.Name()), filepath.Join(top, cluster, n.Name(), "runs"))
	}
	for _, d := range append([]string{top, filepath.Join(top, cluster)}, dirs...) {
		fi, err := os.Lstat(d)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil && !fi.IsDir() {
			err = fmt.Errorf("not a directory (%s)", fi.Mode().Type())
		}
		if err == nil {
			err = os.Lchown(d, os.Geteuid(), os.Getegid())
		}
		if err == nil {
			err = os.Chmod(d, 0o755)
		}
		if err != nil {
			return fmt.Errorf("closing %s to the runs: %w", d, err)
		}
	}
	return nil
}

// simulateFor is the node's profile: --slurm-simulate NODE=PROFILE, else
// --simulate.
func simulateFor(o *agent.Options, s *Flags, node string) string {
	for _, v := range s.Simulate {
		if n, p, _ := strings.Cut(v, "="); n == node {
			return p
		}
	}
	return o.Simulate
}
