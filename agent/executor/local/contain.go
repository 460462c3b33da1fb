package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
)

// Containment is what makes sure nothing a run started outlives it: the
// run's cgroup (every process it started, whatever its session or group)
// and, with a uid of the run's own (RunAs.Private), that uid (every
// process that holds it). Either one alone covers a job that does fork,
// setsid, fork; both together also cover a job on a node without
// cgroups, and a setuid program a job starts (it leaves the uid but not
// the cgroup).
type Containment struct {
	// Cgroup is the run's cgroup; nil for none.
	Cgroup *Cgroup
	// UID, when set, is the run's own uid: every process holding it is
	// the run's.
	UID *uint32
	// tmp, when set, is the run's mount namespace (PrivateTmp): the
	// command starts inside.
	tmp *runTmp
	// tmpMode is Held.TmpMode; snap, when set, what the run's uid had in
	// the node's tmp dirs as the run started (Sweep removes the rest).
	tmpMode string
	snap    *tmpSnapshot
	// removed says Release removed the cgroup.
	removed bool
	// Timeout bounds the wait for the killed processes to be gone
	// (default DefaultKillTimeout): one stuck in the kernel (D state on
	// a dead NFS server or GPU driver) may never go.
	Timeout time.Duration
}

// lockedStart runs start (cmd.Start) on a locked thread in the run's
// cgroup and mount namespace, as far as it has them. release, called once
// the started process is gone, lets that thread go.
func (c *Containment) lockedStart(attr *syscall.SysProcAttr, start func() error) (release func(), err error) {
	// The job's Pdeathsig follows the thread that forks it, and a
	// goroutine that ends locked to its thread (private /tmp's do)
	// retires that thread. So the forking thread stays locked to the
	// caller until release, which the runner calls once the job's
	// leader was reaped: until then it runs nothing else. Locks nest;
	// the ones below end inside this one.
	runtime.LockOSThread()
	inner := func() {}
	switch {
	case c == nil:
		err = (*Cgroup)(nil).lockedStart(attr, start)
	case c.tmp != nil:
		inner, err = c.tmp.startIn(c.Cgroup, attr, start)
	default:
		err = c.Cgroup.lockedStart(attr, start)
	}
	return func() {
		inner()
		runtime.UnlockOSThread()
	}, err
}

// DefaultKillTimeout is Containment.Timeout's default (--run-kill-timeout).
const DefaultKillTimeout = 30 * time.Second

// killPoll is how often a kill is repeated while processes are left.
const killPoll = 20 * time.Millisecond

// Kill kills every process of the run and waits until none is left. The
// error names what is left after the timeout.
func (c *Containment) Kill() error {
	if c == nil || (c.Cgroup == nil && c.UID == nil) {
		return nil
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultKillTimeout
	}
	deadline := time.Now().Add(timeout)
	var errs []error
	if c.Cgroup != nil {
		if err := c.Cgroup.Kill(deadline); err != nil {
			errs = append(errs, err)
		}
	}
	if c.UID != nil {
		if err := killUIDWait(*c.UID, deadline); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killUIDWait kills every process of uid and waits until none is left or
// deadline passes.
func killUIDWait(uid uint32, deadline time.Time) error {
	for {
		if err := killUID(uid); err != nil {
			return fmt.Errorf("killing the processes of uid %d: %w", uid, err)
		}
		left, err := procsOfUID(uid)
		if err != nil {
			return fmt.Errorf("looking for processes of uid %d: %w", uid, err)
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of uid %d are still there after SIGKILL (stuck in the kernel?)", left, uid)
		}
		time.Sleep(killPoll)
	}
}

// killUID sends SIGKILL to every process of uid at once: kill(-1) from a
// thread whose real and effective uid are uid reaches exactly the
// processes whose real or saved uid is uid, and the kernel delivers it
// under the task list lock, so a process forked meanwhile is refused or
// killed too; a /proc scan and kill by pid would race with a fork bomb and
// with pid reuse. Only this thread changes credentials: the raw syscall,
// unlike syscall.Setresuid, does not apply them to the whole process.
// The saved uid stays 0 so the thread can become root again; the real
// uid must change, or kill(-1) would reach every root process.
func killUID(uid uint32) error {
	if uid == 0 {
		return errors.New("refusing to kill every process of uid 0")
	}
	runtime.LockOSThread()
	const keep = ^uintptr(0) // -1: leave unchanged
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), keep); e != 0 {
		runtime.UnlockOSThread()
		return fmt.Errorf("setresuid: %w", e)
	}
	_, _, kerr := syscall.RawSyscall(syscall.SYS_KILL, keep, uintptr(syscall.SIGKILL), 0)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, 0, 0, keep); e != 0 {
		// The thread stays locked: it ends with this goroutine rather
		// than serve the agent as uid.
		return fmt.Errorf("setresuid back to root: %w", e)
	}
	runtime.UnlockOSThread()
	if kerr != 0 && kerr != syscall.ESRCH { // ESRCH: nothing to kill
		return fmt.Errorf("kill: %w", kerr)
	}
	return nil
}

// procStatus reads the state letter and the four uids (real, effective,
// saved, filesystem) of a process from /proc/PID/status.
func procStatus(pid string) (state byte, uids [4]uint32, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, uids, false // gone meanwhile
	}
	var haveState, haveUID bool
	for line := range bytes.Lines(b) {
		switch {
		case bytes.HasPrefix(line, []byte("State:")):
			f := bytes.Fields(line[len("State:"):])
			if len(f) > 0 && len(f[0]) > 0 {
				state, haveState = f[0][0], true
			}
		case bytes.HasPrefix(line, []byte("Uid:")):
			f := bytes.Fields(line[len("Uid:"):])
			if len(f) != 4 {
				return 0, uids, false
			}
			for i := range f {
				n, err := strconv.ParseUint(string(f[i]), 10, 32)
				if err != nil {
					return 0, uids, false
				}
				uids[i] = uint32(n)
			}
			haveUID = true
		}
		if haveState && haveUID {
			return state, uids, true
		}
	}
	return 0, uids, false
}

// eachProc calls f with every live (not zombie) process's pid and uids.
// A zombie has given up its memory, files and cwd: it reads and writes
// nothing, and its parent (init, for an orphan) reaps it.
func eachProc(f func(pid int, uids [4]uint32)) error {
	d, err := os.Open("/proc")
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	self := strconv.Itoa(os.Getpid())
	for _, n := range names {
		// The agent itself: killUID gives one of its threads a run's uid
		// for an instant, which its status may show.
		if n[0] < '0' || n[0] > '9' || n == self {
			continue
		}
		state, uids, ok := procStatus(n)
		if !ok || state == 'Z' || state == 'X' {
			continue
		}
		pid, _ := strconv.Atoi(n)
		f(pid, uids)
	}
	return nil
}

// procUIDs is every uid a live process holds in any of its four uids.
func procUIDs() (map[uint32]bool, error) {
	m := map[uint32]bool{}
	err := eachProc(func(_ int, uids [4]uint32) {
		for _, u := range uids {
			m[u] = true
		}
	})
	return m, err
}

// procsOfUID lists the live processes that hold uid in any of their uids.
func procsOfUID(uid uint32) ([]int, error) {
	var pids []int
	err := eachProc(func(pid int, uids [4]uint32) {
		for _, u := range uids {
			if u == uid {
				pids = append(pids, pid)
				return
			}
		}
	})
	return pids, err
}

// SharedTmpDirs are the world-writable dirs where a job can leave files
// by name outside its work dir and TMPDIR. Whatever a run's own uid owns
// there at the end of the run is removed: the uid is handed to another
// run later, which would own those files.
var SharedTmpDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// sweepShared removes the entries of SharedTmpDirs that uid owns. It runs
// once no process of uid is left, so nothing swaps an entry meanwhile;
// os.RemoveAll does not follow symbolic links either way.
func sweepShared(uid uint32) error {
	var errs []error
	ownedShared(uid, func(e tmpEntry) {
		if err := os.RemoveAll(filepath.Join(e.dir, e.name)); err != nil {
			errs = append(errs, err)
		}
	})
	return errors.Join(errs...)
}

// tmpEntry is one entry of a shared tmp dir, by name and inode: a name
// the run removed and made again is the run's.
type tmpEntry struct {
	dir, name string
	dev, ino  uint64
}

// tmpSnapshot is what a uid that runs share (--run-as, or the agent's own
// without it) owned in SharedTmpDirs as a run started: whatever that uid
// owns there at the run's end and did not then is the run's. The uid's
// other processes (other services' as nobody) keep what they had.
type tmpSnapshot struct {
	uid uint32
	had map[tmpEntry]bool
}

// snapshotShared lists what uid owns in SharedTmpDirs now.
func snapshotShared(uid uint32) *tmpSnapshot {
	s := &tmpSnapshot{uid: uid, had: map[tmpEntry]bool{}}
	s.each(func(e tmpEntry) { s.had[e] = true })
	return s
}

// each calls f with every entry of SharedTmpDirs that s's uid owns,
// as lstat sees it.
func (s *tmpSnapshot) each(f func(tmpEntry)) { ownedShared(s.uid, f) }

// ownedShared calls f with every entry of SharedTmpDirs that uid owns,
// as lstat sees it.
func ownedShared(uid uint32, f func(tmpEntry)) {
	for _, dir := range SharedTmpDirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // not on this node
		}
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil {
				continue
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == uid {
				f(tmpEntry{dir: dir, name: e.Name(), dev: st.Dev, ino: st.Ino})
			}
		}
	}
}

// sweep removes what s's uid added to SharedTmpDirs since the snapshot.
// It runs once the run's processes are gone; in these sticky dirs only
// the uid itself could swap an entry meanwhile, and os.RemoveAll follows
// no symbolic link, the entry's or one below it.
func (s *tmpSnapshot) sweep() error {
	var errs []error
	s.each(func(e tmpEntry) {
		if s.had[e] {
			return
		}
		if err := os.RemoveAll(filepath.Join(e.dir, e.name)); err != nil {
			errs = append(errs, err)
		}
	})
	return errors.Join(errs...)
}

// Host holds the runs of an agent whose runs are processes of this node
// (or whose Runner hands them to a cluster: then it holds what of the run
// can run here, as the run's own uid): the Executor's RunHost.
type Host struct {
	// Cgroups, when set, gives every run a cgroup of its own: its
	// processes start there and are all killed when an attempt ends.
	Cgroups *Cgroups
	// PrivateTmp, when set, gives every run a /tmp, /var/tmp and
	// /dev/shm of its own (a mount namespace); the local Runner
	// (ProcessRunner) only. Without it what a local run's uid adds to the
	// node's is removed at the run's end (with a uid shared by runs,
	// when that uid is not root).
	PrivateTmp *PrivateTmp
	// KillTimeout bounds the wait for a run's processes to be gone once
	// killed (default DefaultKillTimeout; --run-kill-timeout).
	KillTimeout time.Duration
}

// Hold implements RunHost.
func (h *Host) Hold(job executor.Job, runner executor.Runner, tmpDir string) (executor.Held, error) {
	var err error
	contain := &Containment{Timeout: h.KillTimeout}
	// A uid a gang's ranks share is killed by its last holder's
	// UIDRange.Release, once every rank ended.
	if job.RunAs != nil && job.RunAs.Private && !job.RunAs.Shared {
		uid := job.RunAs.UID
		contain.UID = &uid
	}
	if h.Cgroups != nil {
		if contain.Cgroup, err = h.Cgroups.New(job.AllocID); err != nil {
			return nil, fmt.Errorf("run %s: %w", job.AllocID, err)
		}
	}
	// Without a private /tmp, what a uid that runs share adds to the
	// node's tmp dirs during the run is the run's. Never root's: root's
	// other services write there all the time. With one, the run cannot
	// write there, and a sweep would only take what the uid's other
	// processes (another agent's runs, a service as nobody) add meanwhile.
	// A job that runs elsewhere (a Slurm compute node, a pod) has that
	// node's or pod's /tmp: here the uid's entries are the user's own.
	swept := "no: what the run's uid adds to the node's " + strings.Join(SharedTmpDirs, ", ") + " is removed at its end"
	_, local := runner.(ProcessRunner)
	switch {
	case h.PrivateTmp != nil:
		keep := append(slices.Clone(h.PrivateTmp.Keep), job.WorkRoot)
		if contain.tmp, err = h.PrivateTmp.new(job.AllocID, tmpDir, keep); err != nil {
			return nil, fmt.Errorf("run %s: %w", job.AllocID, err)
		}
		contain.tmpMode = h.PrivateTmp.String()
	case !local:
		// Nothing to sweep here, nothing to say.
	case contain.UID != nil:
		contain.tmpMode = swept
	default:
		uid := uint32(os.Geteuid())
		if job.RunAs != nil {
			uid = job.RunAs.UID
		}
		contain.tmpMode = "no: the job runs as root, and what it leaves in the node's " + strings.Join(SharedTmpDirs, ", ") + " stays"
		if uid != 0 {
			contain.snap, contain.tmpMode = snapshotShared(uid), swept
		}
	}
	return contain, nil
}

// CgroupName implements Held.
func (c *Containment) CgroupName() string {
	if c.Cgroup == nil {
		return ""
	}
	return c.Cgroup.String()
}

// TmpMode implements Held.
func (c *Containment) TmpMode() string { return c.tmpMode }

// PrivateTmp implements Held.
func (c *Containment) PrivateTmp() bool { return c.tmp != nil }

// Sweep implements Held.
func (c *Containment) Sweep() error {
	var err error
	if c.UID != nil {
		err = sweepShared(*c.UID)
	} else if c.snap != nil {
		err = c.snap.sweep()
	}
	if err != nil {
		return fmt.Errorf("removing what the run left in %s: %v", strings.Join(SharedTmpDirs, ", "), err)
	}
	return nil
}

// Release implements Held: only once its processes are gone, as then no
// file of the tmpfs is open, and unmounting it frees its memory.
func (c *Containment) Release() []error {
	var errs []error
	if err := c.tmp.Close(); err != nil {
		errs = append(errs, err)
	}
	if c.Cgroup != nil && !c.removed {
		c.removed = true
		if err := c.Cgroup.Remove(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
