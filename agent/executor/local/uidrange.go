package local

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// UIDRange hands every run a uid of its own from --run-as-range. With one
// shared uid (--run-as) a process a job left behind (fork, setsid, fork)
// is a process of the next job too: it can enter the next run's work dir
// through /proc/PID/cwd and write its metrics. With a uid per run, a
// leftover of another run can neither read nor write this run's files nor
// look into its processes, and "every process with uid N" describes the
// run completely, which no job can escape without privileges; the
// executor kills exactly that set when the run ends (killUID), with or
// without cgroups.
type UIDRange struct {
	// Spec is what the operator wrote, for messages.
	Spec        string
	First, Last uint32
	// GID is the primary group of every run when the spec names one
	// (FIRST-LAST:GROUP, e.g. a group that may open the GPUs); without
	// it each run's gid equals its uid, so runs share no group either.
	GID    uint32
	hasGID bool

	// KillTimeout bounds the wait for a shared uid's processes to be
	// gone once its last holder released it (default
	// DefaultKillTimeout; the agent sets --run-kill-timeout).
	KillTimeout time.Duration

	// Guard, when set, reaches where a run's processes are when they
	// are not this node's (a Slurm cluster's compute nodes): a uid is
	// handed out only once Guard claimed it, and given back only once
	// Guard ended everything of it there.
	Guard UIDGuard

	mu   sync.Mutex
	next uint32
	// held are handed out and not yet released; spoiled were released
	// while a process still held them and are never handed out again.
	held, spoiled map[uint32]bool
	// claims are the Guard's claims of the held uids.
	claims map[uint32]func()
	// shared are the held uids handed out under a key (AcquireShared),
	// by key, and sharers how many holders each such uid has.
	shared  map[string]uint32
	sharers map[uint32]int
}

// UIDGuard is what a UIDRange needs from an executor whose runs are not
// processes of this node (agent/executor/slurm's Ledger): the uid's
// processes there are out of procUIDs' sight.
type UIDGuard interface {
	// Claim takes uid for one run, so that no other agent sharing the
	// range hands it out meanwhile; release gives it back. An error
	// says it is another's now: Acquire tries the next one.
	Claim(uid uint32) (release func(), err error)
	// End ends everything that runs as uid (a run's jobs and what they
	// started) and returns once it ended; an error when something of it
	// may still run, which spoils the uid.
	End(uid uint32) error
}

// MaxUIDRange bounds a job uid range; one run at a time needs few uids,
// and a huge range is more likely a typo that overlaps real users.
const MaxUIDRange = 1 << 20

// ParseUIDRange reads FIRST-LAST or FIRST-LAST:GROUP (a group name or
// gid). The range must not include uid 0 and holds at least 2 uids, so
// that a run never gets the uid of the run before it.
func ParseUIDRange(s string) (*UIDRange, error) {
	rng, group, hasGroup := strings.Cut(s, ":")
	a, b, ok := strings.Cut(rng, "-")
	if !ok || !executor.NumericID(a) || !executor.NumericID(b) || (hasGroup && group == "") {
		return nil, fielderr.New(executor.FieldUIDRange, s, "want FIRST-LAST or FIRST-LAST:GROUP, e.g. 200000-200999")
	}
	first, err1 := strconv.ParseUint(a, 10, 32)
	last, err2 := strconv.ParseUint(b, 10, 32)
	switch {
	case err1 != nil || err2 != nil || last >= 1<<32-1:
		return nil, fielderr.New(executor.FieldUIDRange, s, "a uid is out of range")
	case first == 0:
		return nil, fielderr.New(executor.FieldUIDRange, s, "includes uid 0 (root): jobs would read the agent's identity key; start the range above every real user, e.g. 200000-200999")
	case last <= first:
		return nil, fielderr.New(executor.FieldUIDRange, s, "LAST must be above FIRST (two uids at least, so a run never gets the uid of the run before it)")
	case last-first+1 > MaxUIDRange:
		return nil, fielderr.New(executor.FieldUIDRange, s, "holds %d uids, more than %d: give a smaller range", last-first+1, MaxUIDRange)
	}
	r := &UIDRange{Spec: s, First: uint32(first), Last: uint32(last), next: uint32(first), held: map[uint32]bool{}, spoiled: map[uint32]bool{}, claims: map[uint32]func(){},
		shared: map[string]uint32{}, sharers: map[uint32]int{}}
	if hasGroup {
		gid, err := executor.LookupGroup(group)
		if err != nil {
			return nil, fielderr.New(executor.FieldUIDRange, s, "%w", err)
		}
		if gid == 0 {
			return nil, fielderr.New(executor.FieldUIDRange, s, "group 0 (root) would give jobs root's group files; name another group")
		}
		r.GID, r.hasGID = gid, true
	}
	return r, nil
}

// ErrNoFreeUID is returned by Acquire when every uid of the range is held.
var ErrNoFreeUID = errors.New("no free uid")

func (r *UIDRange) runAs(uid uint32) *executor.RunAs {
	gid := uid
	if r.hasGID {
		gid = r.GID
	}
	// No supplementary groups: the agent's (root's) must not leak in, and
	// a group shared by runs would be a way between them.
	return &executor.RunAs{Spec: r.Spec, UID: uid, GID: gid, Groups: []uint32{}, Private: true}
}

// Of is the identity a run that holds uid runs as.
func (r *UIDRange) Of(uid uint32) *executor.RunAs { return r.runAs(uid) }

// Sample is an identity like the ones Acquire hands out, for checks that
// hold for every uid of the range (CanReach: no uid of it owns the dirs
// on the way).
func (r *UIDRange) Sample() *executor.RunAs { return r.runAs(r.First) }

// Acquire hands out a uid of the range that no earlier run still holds
// and that no process on the node has (as real, effective, saved or
// filesystem uid), round robin, so a uid is reused as late as possible.
func (r *UIDRange) Acquire() (*executor.RunAs, error) { return r.AcquireShared("") }

// AcquireShared is Acquire for one of several runs of this agent that are
// one run to the uid's isolation, named by key: the ranks of a gang that
// one cluster job runs, all as the one uid it was submitted as (a Slurm
// agent stands for every node of such a gang). The first holder of key
// gets a uid as Acquire does; every later one, while it is held, the same
// uid, which is given back only by the last holder's Release. No other
// key ever shares it. An empty key shares with nobody.
func (r *UIDRange) AcquireShared(key string) (*executor.RunAs, error) {
	busy, err := procUIDs()
	if err != nil {
		return nil, fielderr.New(executor.FieldUIDRange, r.Spec, "finding uids in use: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if uid, ok := r.shared[key]; ok && key != "" {
		r.sharers[uid]++
		return r.sharedAs(uid), nil
	}
	n := uint64(r.Last) - uint64(r.First) + 1
	for i := uint64(0); i < n; i++ {
		uid := r.next
		if r.next == r.Last {
			r.next = r.First
		} else {
			r.next++
		}
		if r.held[uid] || r.spoiled[uid] || busy[uid] {
			continue
		}
		if r.Guard != nil {
			release, err := r.Guard.Claim(uid)
			if err != nil {
				continue
			}
			r.claims[uid] = release
		}
		r.hold(key, uid)
		return r.heldAs(key, uid), nil
	}
	return nil, fielderr.New(executor.FieldUIDRange, r.Spec, "%w: all %d uids are held by running or left-over processes, or were spoiled by processes that could not be killed; widen the range or restart the node", ErrNoFreeUID, n)
}

// sharedAs is the identity of a run that shares uid with others.
func (r *UIDRange) sharedAs(uid uint32) *executor.RunAs {
	ra := r.runAs(uid)
	ra.Shared = true
	return ra
}

// heldAs is the identity of a run that holds uid, under key if any.
func (r *UIDRange) heldAs(key string, uid uint32) *executor.RunAs {
	if key != "" {
		return r.sharedAs(uid)
	}
	return r.runAs(uid)
}

// hold marks uid held, under key when there is one (under r.mu).
func (r *UIDRange) hold(key string, uid uint32) {
	r.held[uid] = true
	if key != "" {
		r.shared[key] = uid
		r.sharers[uid] = 1
	}
}

// Claim hands out uid itself: a run followed on after the agent
// restarted keeps the uid its job runs as. It fails when uid is not in
// the range, held, spoiled or (Guard) claimed elsewhere.
func (r *UIDRange) Claim(uid uint32) (*executor.RunAs, error) { return r.ClaimShared("", uid) }

// ClaimShared is Claim for a run that shares its uid under key
// (AcquireShared): a uid that key holds already is shared again, not
// refused; one that another key or a run of its own holds is refused.
func (r *UIDRange) ClaimShared(key string, uid uint32) (*executor.RunAs, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if uid < r.First || uid > r.Last {
		return nil, fielderr.New(executor.FieldUIDRange, r.Spec, "uid %d is not in the range", uid)
	}
	if held, ok := r.shared[key]; ok && key != "" {
		if held != uid {
			return nil, fielderr.New(executor.FieldUIDRange, r.Spec, "uid %d: the runs it is shared with hold uid %d", uid, held)
		}
		r.sharers[uid]++
		return r.sharedAs(uid), nil
	}
	if r.held[uid] || r.spoiled[uid] {
		return nil, fielderr.New(executor.FieldUIDRange, r.Spec, "uid %d is held by another run or spoiled", uid)
	}
	if r.Guard != nil {
		release, err := r.Guard.Claim(uid)
		if err != nil {
			return nil, fielderr.New(executor.FieldUIDRange, r.Spec, "uid %d: %w", uid, err)
		}
		r.claims[uid] = release
	}
	r.hold(key, uid)
	return r.heldAs(key, uid), nil
}

// Reap kills the processes that hold a uid of the range: an earlier
// process of this agent was killed during a run, and what the run started
// is still there. The range is this agent's alone, so every such process
// is a leftover. A uid whose processes do not go is spoiled.
func (r *UIDRange) Reap(timeout time.Duration) error {
	busy, err := procUIDs()
	if err != nil {
		return fielderr.New(executor.FieldUIDRange, r.Spec, "finding uids in use: %w", err)
	}
	deadline := time.Now().Add(timeout)
	var errs []error
	for uid := range busy {
		if uid < r.First || uid > r.Last {
			continue
		}
		if err := killUIDWait(uid, deadline); err != nil {
			r.mu.Lock()
			r.spoiled[uid] = true
			r.mu.Unlock()
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Release gives a uid back once its run is over. If a process still holds
// it (the executor could not kill it), the uid is never handed out again
// by this agent, and the error names the processes.
//
// With a Guard, the uid's processes elsewhere are ended first (Guard.End);
// a uid whose processes there may still run is spoiled too, and its claim
// is kept, so that no other agent sharing the range hands it out.
//
// A uid shared under a key (AcquireShared) is only counted down until its
// last holder gives it back: the others' jobs may still run as it. Its
// holders' runs did not kill its processes here at their ends
// (RunAs.Shared); the last Release does, before it looks for any left.
func (r *UIDRange) Release(ra *executor.RunAs) error {
	r.mu.Lock()
	n := r.sharers[ra.UID]
	if n > 1 {
		r.sharers[ra.UID] = n - 1
		r.mu.Unlock()
		return nil
	}
	delete(r.sharers, ra.UID)
	for key, uid := range r.shared {
		if uid == ra.UID {
			delete(r.shared, key)
		}
	}
	r.mu.Unlock()
	var guardErr error
	if r.Guard != nil {
		guardErr = r.Guard.End(ra.UID)
	}
	if n == 1 {
		timeout := r.KillTimeout
		if timeout <= 0 {
			timeout = DefaultKillTimeout
		}
		// What is left is named below; the kill's own error says no more.
		_ = killUIDWait(ra.UID, time.Now().Add(timeout))
	}
	left, err := procsOfUID(ra.UID)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, ra.UID)
	release := r.claims[ra.UID]
	delete(r.claims, ra.UID)
	if err != nil || len(left) > 0 || guardErr != nil {
		r.spoiled[ra.UID] = true
		switch {
		case guardErr != nil:
			return fmt.Errorf("uid %d not reused: %w", ra.UID, guardErr)
		case err != nil:
			return fmt.Errorf("uid %d not reused: looking for its processes: %w", ra.UID, err)
		}
		return fmt.Errorf("uid %d not reused: processes %v still hold it", ra.UID, left)
	}
	if release != nil {
		release()
	}
	return nil
}
