package slurm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gpupass/gpupass/internal/fsutil"
)

// Ledger is the agent's record of the jobs it submitted for live runs,
// kept on the login node, where no job can write (unlike the shared dir,
// which every job of the account can): every job of the account that it
// does not hold was started by a job, and is cancelled (Sweep). All of an
// account's agents (gpupass up's regions) share one ledger dir, else each
// would cancel the others' jobs.
//
// Every run's job runs as the agent's one account, so a job can sbatch a
// job of its own that outlives its run and writes the next run's files,
// or scancel other runs' jobs: the ledger is what tells the agent's jobs
// from those.
type Ledger struct {
	// Dir holds one file per attempt's job (ALLOC.N.job) and one per
	// conformance step in flight (check-NONCE), the lock file that
	// serializes a submit and its record against a sweep, and one lock
	// file per uid of a --run-as-range that a run holds (uid-N.lock).
	Dir string
	// Polices, when set, says whose jobs are the runs': every job of
	// such a uid that the ledger does not hold is a stray. Nil: the
	// agent's own uid's (every run's jobs run as the agent's account).
	// With a uid per run (--run-as-range) the runs' uids are, and not
	// the agent's own: a job of the range cannot submit one as another
	// uid, and the agent's (root's) other jobs are not the runs'.
	Polices func(uid int) bool
}

// ledgerEntry is ALLOC.N.job.
type ledgerEntry struct {
	JobID string `json:"job_id"`
}

const lockFile = ".lock"

// lock holds the ledger's lock (flock, so agents of one account in other
// processes wait too) until the returned func is called. A submit holds
// it from sbatch until the job is recorded, and a sweep from listing the
// jobs until it has cancelled them: a sweep never sees a job of the agent
// that is not recorded yet.
func (l *Ledger) lock() (func(), error) {
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the slurm ledger dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(l.Dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the slurm ledger's lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking the slurm ledger: %w", err)
	}
	return func() { f.Close() }, nil
}

func (l *Ledger) entryPath(alloc, attempt string) string {
	return filepath.Join(l.Dir, alloc+"."+attempt+".job")
}

// record notes the job an attempt was submitted as (under the lock).
func (l *Ledger) record(alloc, attempt, jobID string) error {
	b, _ := json.Marshal(ledgerEntry{JobID: jobID})
	if err := fsutil.WriteFileAtomic(l.entryPath(alloc, attempt), b, 0o600); err != nil {
		return fmt.Errorf("recording slurm job %s in the ledger: %w", jobID, err)
	}
	return nil
}

// Lookup is the job the agent submitted for the attempt, if it recorded
// one.
func (l *Ledger) Lookup(alloc, attempt string) (string, bool) {
	b, err := os.ReadFile(l.entryPath(alloc, attempt))
	if err != nil {
		return "", false
	}
	var e ledgerEntry
	if json.Unmarshal(b, &e) != nil || e.JobID == "" {
		return "", false
	}
	return e.JobID, true
}

// forget drops the attempt's job once its end is read: from then on
// nothing of the run may run, and a job that still does is a stray.
func (l *Ledger) forget(alloc, attempt string) {
	_ = os.Remove(l.entryPath(alloc, attempt))
}

// ForgetRun drops every attempt of the run alloc, whose jobs the agent
// cancelled without following them to their end (it died before the
// attempt was marked): the run may be placed here again, and its first
// attempt must not find the cancelled job.
func (l *Ledger) ForgetRun(alloc string) {
	matches, _ := filepath.Glob(filepath.Join(l.Dir, alloc+".*.job"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
}

// Hold records a conformance step about to start (srun is a job of the
// account too) and returns the comment the step's job carries and the
// func that forgets it once srun has returned. A job can copy a live
// comment (scontrol shows it), but then it lives only as long as the
// step.
func (l *Ledger) Hold() (comment string, release func(), err error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	nonce := hex.EncodeToString(b[:])
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("making the slurm ledger dir: %w", err)
	}
	p := filepath.Join(l.Dir, "check-"+nonce)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		return "", nil, fmt.Errorf("recording a conformance step in the slurm ledger: %w", err)
	}
	return checkComment(nonce), func() { _ = os.Remove(p) }, nil
}

func checkComment(nonce string) string { return "gpupass-check-" + nonce }

// owned is what the ledger holds: the job ids recorded and the comments
// of the steps in flight.
func (l *Ledger) owned() (ids, comments map[string]bool, err error) {
	ents, err := os.ReadDir(l.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("reading the slurm ledger: %w", err)
	}
	ids, comments = map[string]bool{}, map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		if nonce, ok := strings.CutPrefix(name, "check-"); ok {
			comments[checkComment(nonce)] = true
			continue
		}
		if !strings.HasSuffix(name, ".job") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.Dir, name))
		if err != nil {
			continue
		}
		var le ledgerEntry
		if json.Unmarshal(b, &le) == nil && le.JobID != "" {
			ids[le.JobID] = true
		}
	}
	return ids, comments, nil
}

// SweepWait bounds the wait for the jobs a sweep cancelled to end: they
// get SIGKILL at once, so this is slurmd's time to reap them.
const SweepWait = time.Minute

// Submit submits an attempt's job (sbatch, which returns its id) and
// records it, with no sweep in between; strays of the account are
// cancelled first, and must have ended, so that none is left to write
// into the new job's files. It returns the strays it cancelled.
//
// ranks are the allocations of a gang's other ranks, whose attempts of
// the same number the one job runs too: the job is recorded for each, so
// that an agent restarted under the gang finds it again from every rank
// (and never submits one of its own for a rank), and it stays the
// agent's until the last rank has read its end.
func (l *Ledger) Submit(ctx context.Context, c *Client, alloc, attempt string, sbatch func() (string, error), ranks ...string) (id string, strays []Job, err error) {
	unlock, err := l.lock()
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	if strays, err = l.cancelStrays(ctx, c); err != nil {
		return "", strays, err
	}
	if err := waitEnded(ctx, c, strays, SweepWait); err != nil {
		return "", strays, fmt.Errorf("not submitting while a job the agent did not submit runs: %w", err)
	}
	if id, err = sbatch(); err != nil {
		return "", strays, err
	}
	for _, a := range append([]string{alloc}, ranks...) {
		if err := l.record(a, attempt, id); err != nil {
			return id, strays, err
		}
	}
	return id, strays, nil
}

// Sweep cancels every job of this account (uid) that Slurm has not ended
// and the ledger does not hold, with SIGKILL at once (a stray gets no
// grace to write on), and waits for them to end, at most wait. It returns
// the jobs it cancelled; an error when it could not list them or one of
// them outlived the wait.
func (l *Ledger) Sweep(ctx context.Context, c *Client, wait time.Duration) ([]Job, error) {
	unlock, err := l.lock()
	if err != nil {
		return nil, err
	}
	strays, err := l.cancelStrays(ctx, c)
	unlock()
	if err != nil || len(strays) == 0 {
		return nil, err
	}
	return strays, waitEnded(ctx, c, strays, wait)
}

// cancelStrays cancels the strays (under the lock).
func (l *Ledger) cancelStrays(ctx context.Context, c *Client) ([]Job, error) {
	strays, err := l.strays(ctx, c)
	if err != nil || len(strays) == 0 {
		return nil, err
	}
	ids := make([]string, len(strays))
	for i, j := range strays {
		ids[i] = j.ID
	}
	// --full reaches the batch script's own processes; the plain scancel
	// ends a pending one (and one the signal did not end).
	_, _ = c.run(ctx, nil, "scancel", append([]string{"--full", "--signal=KILL"}, ids...)...)
	_, _ = c.run(ctx, nil, "scancel", ids...)
	return strays, nil
}

// strays are the account's jobs Slurm has not ended that the ledger does
// not hold.
func (l *Ledger) strays(ctx context.Context, c *Client) ([]Job, error) {
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return nil, err
	}
	// Read after listing: a step's comment is recorded before its job
	// exists, so every step listed is found here.
	ids, comments, err := l.owned()
	if err != nil {
		return nil, err
	}
	polices := l.Polices
	if polices == nil {
		uid := os.Getuid()
		polices = func(u int) bool { return u == uid }
	}
	var strays []Job
	for _, j := range jobs {
		if !polices(j.UserID) || j.Phase() == Ended || ids[j.ID] || comments[j.Comment] {
			continue
		}
		// A conformance step whose srun returned is forgotten while
		// slurmd still reaps it: ending already, not a stray.
		if j.State == "COMPLETING" && strings.HasPrefix(j.Comment, checkComment("")) {
			continue
		}
		strays = append(strays, j)
	}
	return strays, nil
}

// waitEnded waits until Slurm says every job of jobs ended (or forgot
// it): a job in COMPLETING may still have processes that write.
func waitEnded(ctx context.Context, c *Client, jobs []Job, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	left := slices.Clone(jobs)
	for {
		var still []Job
		for _, j := range left {
			now, err := c.Job(ctx, j.ID)
			if errors.Is(err, ErrNoJob) || (err == nil && now.Phase() == Ended) {
				continue
			}
			if err == nil {
				j = now
			}
			still = append(still, j)
		}
		if len(still) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("cancelled %s, still not ended after %s", still[0].Describe(), wait)
		}
		left = still
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// UIDGuard is the local.UIDGuard of a --run-as-range on a Slurm
// cluster: the run's processes are its jobs on the compute nodes, which
// the login node's process table does not show.
type UIDGuard struct {
	Ledger *Ledger
	Client *Client
	// Wait bounds the wait for the uid's cancelled jobs to end
	// (default SweepWait).
	Wait time.Duration
}

// Claim takes uid with a lock file in the ledger dir (flock, held until
// release): agents that share the range share the ledger dir (as they
// must, else each cancels the other's jobs), so two of them never hand
// one uid to two live runs. A lock that a dead agent held is free again;
// what its run left is the sweep's.
func (g UIDGuard) Claim(uid uint32) (func(), error) {
	if err := os.MkdirAll(g.Ledger.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the slurm ledger dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(g.Ledger.Dir, fmt.Sprintf("uid-%d.lock", uid)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening uid %d's lock: %w", uid, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("uid %d is held by a run of another agent sharing the ledger dir", uid)
	}
	return func() { f.Close() }, nil
}

// End cancels every job of uid that Slurm has not ended (the run's own
// and any its jobs submitted), with SIGKILL, and waits for them to end:
// only then is the uid handed to another run.
func (g UIDGuard) End(uid uint32) error {
	wait := g.Wait
	if wait <= 0 {
		wait = SweepWait
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait+time.Minute)
	defer cancel()
	jobs, err := g.Client.Jobs(ctx)
	if err != nil {
		return fmt.Errorf("listing uid %d's slurm jobs: %w", uid, err)
	}
	var left []Job
	var ids []string
	for _, j := range jobs {
		if j.UserID == int(uid) && j.Phase() != Ended {
			left, ids = append(left, j), append(ids, j.ID)
		}
	}
	if len(left) == 0 {
		return nil
	}
	_, _ = g.Client.run(ctx, nil, "scancel", append([]string{"--full", "--signal=KILL"}, ids...)...)
	_, _ = g.Client.run(ctx, nil, "scancel", ids...)
	if err := waitEnded(ctx, g.Client, left, wait); err != nil {
		return fmt.Errorf("uid %d's slurm jobs: %w", uid, err)
	}
	return nil
}

// DescribeStrays names the jobs a sweep cancelled, for the run's log.
func DescribeStrays(jobs []Job) string {
	var b strings.Builder
	for i, j := range jobs {
		if i > 0 {
			b.WriteString("; ")
		}
		if i == 4 {
			fmt.Fprintf(&b, "and %d more", len(jobs)-i)
			break
		}
		fmt.Fprintf(&b, "job %s (%s, %s", j.ID, j.Name, j.State)
		if j.Node != "" {
			b.WriteString(" on " + j.Node)
		}
		b.WriteString(")")
	}
	return b.String()
}
