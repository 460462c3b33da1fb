package local

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Cgroups makes a cgroup per run, where the run's processes start and
// stay whatever they do to their session or process group: at the end of
// the run the cgroup is frozen (no process of it can fork any more),
// every member is killed, and the agent waits until it is empty.
//
// cgroup v2 (one unified hierarchy): the runs' cgroups are children of
// the agent's own (its systemd unit has Delegate=yes), and a command
// starts in its run's cgroup (clone3 CLONE_INTO_CGROUP), so no process of
// it ever runs outside. cgroup v1: the freezer and pids hierarchies; v1
// moves single threads, so the thread that forks the command enters the
// run's cgroups for the fork and leaves them after, which again puts the
// command there from its first instruction.
type Cgroups struct {
	// Version is 1 or 2.
	Version int
	// Parents are where runs' cgroups go: v2 one dir, v1 the freezer
	// dir then (when mounted) the pids dir.
	Parents []string
	// Homes (v1) are the agent's own cgroups in the same hierarchies,
	// where the forking thread returns.
	Homes []string
	// PidsMax, when above 0, bounds the processes and threads of a run
	// (pids.max), against fork bombs (--run-pids-max).
	PidsMax int64
}

// CgroupRoot is where cgroup file systems are mounted.
const CgroupRoot = "/sys/fs/cgroup"

const (
	cgroup2Magic = 0x63677270
	cgroupMagic  = 0x27e0eb
)

// DetectCgroups finds the cgroup hierarchy this node has (v2, else v1's
// freezer) and checks that the agent can make a run's cgroup there. The
// error says why not (not root, no freezer, a v2 cgroup without
// delegation). Runs' cgroups go to gpupass-runs/<agent>/ below the
// agent's own cgroup: agent names one agent (its state dir), so that
// Reap after a restart touches its own leftovers only.
func DetectCgroups(root, agent string) (*Cgroups, error) {
	if agent == "" || strings.ContainsAny(agent, "/.") {
		return nil, fmt.Errorf("cgroup name %q: want a plain name", agent)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/cgroup: %w", err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		return nil, fmt.Errorf("no cgroup file system at %s: %w", root, err)
	}
	var m *Cgroups
	if st.Type == cgroup2Magic {
		p, ok := cgroupPath(self, "")
		if !ok {
			return nil, errors.New("cgroup v2, but /proc/self/cgroup has no 0:: line")
		}
		m = &Cgroups{Version: 2, Parents: []string{filepath.Join(root, p, "gpupass-runs", agent)}}
	} else {
		m = &Cgroups{Version: 1}
		for _, c := range []string{"freezer", "pids"} {
			dir := filepath.Join(root, c)
			if err := syscall.Statfs(dir, &st); err != nil || st.Type != cgroupMagic {
				if c == "freezer" {
					return nil, fmt.Errorf("cgroup v1 without the freezer hierarchy at %s", dir)
				}
				continue
			}
			p, ok := cgroupPath(self, c)
			if !ok {
				return nil, fmt.Errorf("cgroup v1: /proc/self/cgroup names no %s cgroup", c)
			}
			m.Homes = append(m.Homes, filepath.Join(dir, p))
			m.Parents = append(m.Parents, filepath.Join(dir, p, "gpupass-runs", agent))
		}
	}
	// A trial cgroup: not root, a read-only mount or a v2 parent with
	// processes and controllers all fail here rather than at a run.
	g, err := m.New(fmt.Sprintf("probe-%d-%d", os.Getpid(), probes.Add(1)))
	if err != nil {
		return nil, err
	}
	if err := g.Remove(); err != nil {
		return nil, err
	}
	return m, nil
}

// probes numbers DetectCgroups' trial cgroups.
var probes atomic.Int64

// cgroupPath finds the path of controller's hierarchy ("" for v2's
// unified one) in a /proc/PID/cgroup listing.
func cgroupPath(listing []byte, controller string) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(listing))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		if controller == "" && f[0] == "0" && f[1] == "" {
			return f[2], true
		}
		for _, c := range strings.Split(f[1], ",") {
			if controller != "" && c == controller {
				return f[2], true
			}
		}
	}
	return "", false
}

// String says which hierarchy runs' cgroups go to, for the agent's log.
func (m *Cgroups) String() string {
	return fmt.Sprintf("cgroup v%d under %s", m.Version, strings.Join(m.Parents, " and "))
}

// Reap kills and removes every run's cgroup left under the parents: an
// earlier process of this agent was killed (or crashed) during a run,
// and what that run started is still in it.
func (m *Cgroups) Reap() error {
	names := map[string]bool{}
	for _, p := range m.Parents {
		ents, err := os.ReadDir(p)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() {
				names[e.Name()] = true
			}
		}
	}
	var errs []error
	for n := range names {
		g, err := m.New(n) // empties it
		if err == nil {
			err = g.Remove()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemoveParents removes the (empty) parents of the runs' cgroups, when
// the agent stops.
func (m *Cgroups) RemoveParents() error {
	var errs []error
	for _, p := range m.Parents {
		if err := syscall.Rmdir(p); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// Cgroup is one run's cgroup (one dir per hierarchy).
type Cgroup struct {
	version int
	dirs    []string
	homes   []string
}

// New makes the cgroup of run name. One left from an earlier placement of
// the same run (the agent was killed) is emptied and reused.
func (m *Cgroups) New(name string) (*Cgroup, error) {
	g := &Cgroup{version: m.Version, homes: m.Homes}
	for _, p := range m.Parents {
		d := filepath.Join(p, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("making the run's cgroup %s: %w", d, err)
		}
		g.dirs = append(g.dirs, d)
	}
	if err := g.Kill(time.Now().Add(DefaultKillTimeout)); err != nil {
		return nil, fmt.Errorf("emptying an earlier cgroup of the run: %w", err)
	}
	if m.PidsMax > 0 {
		for _, d := range g.dirs {
			p := filepath.Join(d, "pids.max")
			if _, err := os.Stat(p); err != nil {
				continue // v2 without the pids controller delegated
			}
			if err := writeCgroup(p, strconv.FormatInt(m.PidsMax, 10)); err != nil {
				return nil, err
			}
		}
	}
	return g, nil
}

// String names the cgroup, for events.
func (g *Cgroup) String() string { return strings.Join(g.dirs, " and ") }

func writeCgroup(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", value, path, err)
	}
	return nil
}

// start prepares a command's start in the cgroup. On v2 it sets attr to
// clone into the cgroup; the returned func closes the dir after Start.
// On v1 it moves the calling thread, which the caller has locked and
// forks from, into the cgroup; the returned func moves it back. A thread
// that cannot go back stays locked and dies with its goroutine.
func (g *Cgroup) start(attr *syscall.SysProcAttr) (after func() error, err error) {
	if g.version == 2 {
		fd, err := syscall.Open(g.dirs[0], syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening the run's cgroup: %w", err)
		}
		attr.UseCgroupFD, attr.CgroupFD = true, fd
		return func() error { return syscall.Close(fd) }, nil
	}
	tid := strconv.Itoa(syscall.Gettid())
	back := func(n int) error {
		var errs []error
		for _, h := range g.homes[:n] {
			errs = append(errs, writeCgroup(filepath.Join(h, "tasks"), tid))
		}
		return errors.Join(errs...)
	}
	for i, d := range g.dirs {
		if err := writeCgroup(filepath.Join(d, "tasks"), tid); err != nil {
			if berr := back(i); berr != nil {
				return nil, fmt.Errorf("%w; and moving the agent's thread back: %w", err, berr)
			}
			return nil, err
		}
	}
	return func() error { return back(len(g.dirs)) }, nil
}

// Procs lists the processes in the cgroup.
func (g *Cgroup) Procs() ([]int, error) {
	seen := map[int]bool{}
	var pids []int
	for _, d := range g.dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			return nil, err
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil && !seen[n] {
				seen[n] = true
				pids = append(pids, n)
			}
		}
	}
	return pids, nil
}

// Kill freezes the cgroup, kills every member, thaws it and waits until
// it is empty or deadline passes. v2 with cgroup.kill (Linux 5.14) has
// the kernel do all of that at once.
func (g *Cgroup) Kill(deadline time.Time) error {
	d := g.dirs[0]
	killed := false
	if g.version == 2 {
		if err := writeCgroup(filepath.Join(d, "cgroup.kill"), "1"); err == nil {
			killed = true
		}
	}
	if !killed {
		freeze, thaw, file := "FROZEN", "THAWED", "freezer.state"
		if g.version == 2 {
			freeze, thaw, file = "1", "0", "cgroup.freeze"
		}
		if err := writeCgroup(filepath.Join(d, file), freeze); err != nil {
			return err
		}
		// Frozen, no member can fork: the list below is complete.
		// A member stuck in the kernel may keep the freeze from
		// finishing; it is killed all the same and shows up below.
		for !g.frozen() && time.Now().Before(deadline) {
			time.Sleep(killPoll)
		}
		pids, err := g.Procs()
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if terr := writeCgroup(filepath.Join(d, file), thaw); err == nil {
			err = terr
		}
		if err != nil {
			return fmt.Errorf("killing the processes of cgroup %s: %w", d, err)
		}
	}
	for {
		pids, err := g.Procs()
		if err != nil {
			return fmt.Errorf("listing the processes of cgroup %s: %w", d, err)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of cgroup %s are still there after SIGKILL (stuck in the kernel?)", pids, g)
		}
		// Repeated: a v1 freeze that did not finish may have let a
		// member fork.
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(killPoll)
	}
}

func (g *Cgroup) frozen() bool {
	if g.version == 2 {
		b, err := os.ReadFile(filepath.Join(g.dirs[0], "cgroup.events"))
		return err == nil && bytes.Contains(b, []byte("frozen 1"))
	}
	b, err := os.ReadFile(filepath.Join(g.dirs[0], "freezer.state"))
	return err == nil && strings.TrimSpace(string(b)) == "FROZEN"
}

// Remove deletes the (empty) cgroup.
func (g *Cgroup) Remove() error {
	var errs []error
	for _, d := range g.dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// lockedStart runs start (cmd.Start) on a locked thread inside the
// cgroup; with no cgroup, on a locked thread only (Pdeathsig follows the
// forking thread).
func (g *Cgroup) lockedStart(attr *syscall.SysProcAttr, start func() error) error {
	runtime.LockOSThread()
	if g == nil {
		err := start()
		runtime.UnlockOSThread()
		return err
	}
	after, err := g.start(attr)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	startErr := start()
	if err := after(); err != nil && startErr == nil && g.version == 1 {
		// The thread could not leave the run's cgroup: it stays
		// locked, so nothing else of the agent runs there, and ends
		// with the runner's goroutine. The command itself started.
		return nil
	}
	runtime.UnlockOSThread()
	return startErr
}
