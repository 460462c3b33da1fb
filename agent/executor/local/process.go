package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
)

// ProcessRunner runs an attempt as a process group on this node.
//
// The command is the leader of its own process group (Setpgid), so a stop
// reaches everything it started: SIGTERM to the group, SIGKILL to the
// group after the grace period. The grace period is the group's, not only
// the leader's: a child still saving a checkpoint after its wrapper
// exited is waited for. When the leader ends by itself, whatever
// it left running in its group is killed too, so no process outlives its
// run. A process that leaves the group (setsid) escapes the group
// signals; Attempt.Contain (the run's cgroup, the run's own uid) catches
// it: whatever is left there when the leader is gone is killed before Run
// returns.
type ProcessRunner struct {
	// DrainTimeout bounds the wait for output after the group is gone
	// (default 2s); a process that escaped the group may hold the pipes.
	DrainTimeout time.Duration
}

// Run implements Runner.
func (p ProcessRunner) Run(ctx context.Context, a executor.Attempt, out func(executor.Line)) executor.Exit {
	if len(a.Command) == 0 {
		return executor.Exit{Code: -1, StartErr: errors.New("empty command")}
	}
	grace := a.Grace
	if grace <= 0 {
		grace = executor.DefaultGrace
	}
	drain := p.DrainTimeout
	if drain <= 0 {
		drain = 2 * time.Second
	}
	cmd := exec.Command(a.Command[0], a.Command[1:]...)
	if cmd.Err != nil {
		return executor.Exit{Code: -1, StartErr: cmd.Err}
	}
	cmd.Dir, cmd.Env = a.Dir, a.Env
	if a.Dir != "" {
		// os/exec sets PWD only for an inherited environment; shells
		// and Python's os.getcwd users expect it to match the work dir.
		cmd.Env = append(withoutKey(a.Env, "PWD"), "PWD="+a.Dir)
	}
	// Pdeathsig: if the agent itself dies (kill -9), the job's leader
	// is killed rather than left training unsupervised. The signal
	// follows the thread that forked, so Start runs on a locked thread;
	// the Go runtime does not retire threads otherwise.
	// The kernel applies Pdeathsig after the credentials, so it holds
	// for a job started as another user too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: a.Credential}
	rOut, wOut, err := os.Pipe()
	if err != nil {
		return executor.Exit{Code: -1, StartErr: fmt.Errorf("creating stdout pipe: %w", err)}
	}
	rErr, wErr, err := os.Pipe()
	if err != nil {
		rOut.Close()
		wOut.Close()
		return executor.Exit{Code: -1, StartErr: fmt.Errorf("creating stderr pipe: %w", err)}
	}
	cmd.Stdout, cmd.Stderr = wOut, wErr
	// The hold of a RunHost other than Host (none) holds nothing here.
	contain, _ := a.Contain.(*Containment)
	release, startErr := contain.lockedStart(cmd.SysProcAttr, cmd.Start)
	// After the leader was reaped: the thread that forked it holds its
	// Pdeathsig.
	defer release()
	wOut.Close()
	wErr.Close()
	if startErr != nil {
		rOut.Close()
		rErr.Close()
		return executor.Exit{Code: -1, StartErr: startErr}
	}
	pid := cmd.Process.Pid

	var readers sync.WaitGroup
	for _, s := range []struct {
		f  *os.File
		st events.Stream
	}{{rOut, events.Stdout}, {rErr, events.Stderr}} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			// A read error other than EOF (the pipe closed under us
			// after the drain timeout) ends the stream; the exit status
			// still tells the story.
			_ = executor.ReadLines(s.f, s.st, a.MaxLine, out)
		}()
	}

	exited := make(chan error, 1)
	go func() { exited <- waitNoReap(pid) }()

	var (
		ex      executor.Exit
		waitErr error
		reaped  bool
	)
	select {
	case <-exited:
	case <-ctx.Done():
		ex.Stopped = true
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-exited:
			// The leader is often a wrapper (sh -c, torchrun) that dies
			// at once while its children are still saving a checkpoint:
			// they get the rest of the grace period too. The leader is
			// reaped first, as a zombie leader would keep the group
			// looking alive; the group id stays reserved while any
			// member lives, so the signals below cannot reach a
			// stranger (unless the last member exits and its pid is
			// reused in the instant between the check and the kill).
			waitErr, reaped = cmd.Wait(), true
			if !waitGroupGone(pid, t.C) {
				ex.Killed = true
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
		case <-t.C:
			ex.Killed = true
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			<-exited
		}
	}
	if !reaped {
		// The leader is a zombie now, so its pid (and so the group id)
		// cannot be reused yet: killing the group reaches only its own
		// leftovers.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		waitErr = cmd.Wait()
	}
	// Before the drain: a process that left the group may hold the
	// pipes, and it must be gone before the next attempt or run starts.
	if a.Contain != nil {
		ex.Leftover = a.Contain.Kill()
	}

	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		rOut.Close()
		rErr.Close()
		<-done
	}
	rOut.Close()
	rErr.Close()

	ex.Code = -1
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case st.Exited():
			ex.Code = st.ExitStatus()
		case st.Signaled():
			ex.Signal = st.Signal().String()
			ex.Killed = ex.Killed || st.Signal() == syscall.SIGKILL
		}
	} else if waitErr != nil {
		ex.StartErr = fmt.Errorf("waiting for the process: %w", waitErr)
	}
	return ex
}

// waitNoReap waits until pid has exited without reaping it
// (waitid(P_PID, pid, WEXITED|WNOWAIT)).
func waitNoReap(pid int) error {
	const (
		pPID    = 1
		wExited = 0x4
		wNoWait = 0x1000000
	)
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
}

// groupPoll is how often a stopped attempt's process group is checked
// for members left after its leader ended; every zombieScanEvery-th check
// also looks for members that ended but were not reaped yet.
const (
	groupPoll       = 20 * time.Millisecond
	zombieScanEvery = 10
)

// waitGroupGone waits until process group pgid has no live member left,
// or until deadline fires; it reports whether the group is gone. A member
// that cannot be signalled (EPERM) still counts as alive.
func waitGroupGone(pgid int, deadline <-chan time.Time) bool {
	t := time.NewTicker(groupPoll)
	defer t.Stop()
	for i := 1; ; i++ {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		// The orphaned members' new parent (init, or a container's
		// PID 1) may reap them late or never, and a zombie answers
		// kill like a live process. A scan of /proc costs more, so it
		// runs only now and then.
		if i%zombieScanEvery == 0 && onlyZombies(pgid) {
			// The zombies still hold the group id; the kill sweeps up
			// a member forked while the scan ran.
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return true
		}
		select {
		case <-deadline:
			return false
		case <-t.C:
		}
	}
}

// onlyZombies reports whether every process of group pgid has ended
// (zombie or dead) according to /proc; false when /proc cannot be read.
func onlyZombies(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	want := strconv.Itoa(pgid)
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[2] != want {
			continue
		}
		if f[0] != "Z" && f[0] != "X" {
			return false
		}
	}
	return true
}

func withoutKey(env []string, key string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}
