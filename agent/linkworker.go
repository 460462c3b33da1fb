package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
)

// The link measurement's interpreter imports torch before it can measure
// anything: 1.3 s on an idle 2-core node, twice that with both ranks of a
// gang importing at once, all of it between the gang's placement and its
// job's start (issue #34's bench: 2.94× srun -N2 with a cold start, ranks
// starting 4.9 s after submit). So an agent that runs gang ranks itself
// (the local executor) keeps one measurement process started ahead of
// time, torch imported, waiting on stdin for a gang's rendezvous. It is
// the same interpreter, script, isolation (-I), environment and
// measurement as a cold start: only when the process was started
// differs. Each is used for one gang, then replaced by a fresh one once
// the node has no run in progress (its import must not take CPU from the
// job that just started), so nothing carries from one gang to the next.
// The first is started after the node's first gang (which measures
// cold): a node that never takes one keeps no such process.

// linkWorkerMaxAge is how long a warm worker may wait for a gang: one
// older predates whatever was installed on the node since (the node's
// Python or torch upgraded under it), so it is replaced and the gang
// starts a cold one rather than measure with what is no longer there.
const linkWorkerMaxAge = time.Hour

// linkOutputLimit bounds what the measurement may print (one JSON line
// and torch's warnings are far below it).
const linkOutputLimit = 64 << 10

// linkRequest is the rendezvous a worker reads on stdin (allreduce.py).
type linkRequest struct {
	MasterAddr     string `json:"master_addr"`
	MasterPort     int    `json:"master_port"`
	Rank           int    `json:"rank"`
	WorldSize      int    `json:"world_size"`
	LocalRank      int    `json:"local_rank"`
	Bytes          int    `json:"bytes"`
	Iterations     int    `json:"iterations"`
	TimeoutSeconds int    `json:"timeout_seconds"`
}

// linkWorker is one started measurement process.
type linkWorker struct {
	py      string
	started time.Time
	pid     int
	stdin   io.WriteCloser
	out     *capped
	errb    *capped
	// ready is closed at its first line ({"ready": true}): torch is
	// imported and it waits for the rendezvous.
	ready chan struct{}
	// done is closed once the process exited and was reaped; err is
	// its exit status then.
	done chan struct{}
	err  error
}

// startLinkWorker starts py on allreduce.py, isolated (-I: no cwd, no
// PYTHON* variables, no user site) with the job's environment less the
// agent's own variables: nothing a job or its bundle brought. It leads
// its own process group, and Pdeathsig kills it if the agent dies; the
// signal follows the thread that forked, so the fork happens on a thread
// locked until the process was reaped.
func startLinkWorker(py string) (*linkWorker, error) {
	cmd := exec.Command(py, "-I", "-c", allreduceScript)
	// The size the measurement sends, so that the process makes its
	// tensor while it waits (allreduce.py).
	cmd.Env = append(executor.JobEnviron(os.Environ()), "GPUPASS_LINK_BYTES="+strconv.Itoa(linkBytes))
	cmd.Dir = os.TempDir()
	w := &linkWorker{py: py, errb: &capped{max: linkOutputLimit}, ready: make(chan struct{}), done: make(chan struct{})}
	w.out = &capped{max: linkOutputLimit, line: w.ready}
	cmd.Stdout, cmd.Stderr = w.out, w.errb
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	w.stdin = stdin
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, after
		// the process was reaped.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		w.pid = cmd.Process.Pid
		w.started = time.Now()
		started <- nil
		w.err = cmd.Wait()
		close(w.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return w, nil
}

// alive reports whether the process has not exited.
func (w *linkWorker) alive() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

// stop ends the worker's process group and waits until it was reaped.
func (w *linkWorker) stop() {
	if w.alive() {
		_ = syscall.Kill(-w.pid, syscall.SIGKILL)
	}
	<-w.done
}

// measure hands the worker the rendezvous and waits for its result line,
// at most until ctx ends (then the worker is killed). The worker is
// spent either way. errWorkerGone says the worker was dead before it
// took the rendezvous: nothing of the gang's was started, so a fresh
// worker may be started in its place.
func (w *linkWorker) measure(ctx context.Context, req linkRequest) (string, error) {
	defer w.stop()
	line, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	if !w.alive() {
		return "", fmt.Errorf("%w: %s", errWorkerGone, w.exitReason())
	}
	if _, err := w.stdin.Write(append(line, '\n')); err != nil {
		// The pipe's reader is gone: the process exited (or is
		// exiting) before it read a byte of the rendezvous.
		<-w.done
		return "", fmt.Errorf("%w: %s", errWorkerGone, w.exitReason())
	}
	_ = w.stdin.Close()
	select {
	case <-w.done:
	case <-ctx.Done():
		_ = syscall.Kill(-w.pid, syscall.SIGKILL)
		<-w.done
		return "", fmt.Errorf("%s: %w: %s", w.py, ctx.Err(), lastLine(w.errb.String()))
	}
	if w.err != nil {
		return "", fmt.Errorf("%s: %w", w.py, errors.New(w.exitReason()))
	}
	return lastLine(w.out.String()), nil
}

func (w *linkWorker) exitReason() string {
	if w.err == nil {
		return "exited 0"
	}
	if s := lastLine(w.errb.String()); s != "" {
		return w.err.Error() + ": " + s
	}
	return w.err.Error()
}

var errWorkerGone = errors.New("the measurement process exited before it read the rendezvous")

// linkWorkers keeps the agent's one warm worker.
type linkWorkers struct {
	py  string
	log *slog.Logger
	// idle reports that the node has no run in progress: a worker is
	// started only then.
	idle func() bool

	mu      sync.Mutex
	warm    *linkWorker
	stopped bool
	// refilling is set while a goroutine waits to start the next one.
	refilling bool
	wg        sync.WaitGroup
	// stopc ends refill's wait.
	stopc chan struct{}
	// poll is how often refill looks whether the node is idle.
	poll time.Duration
}

func newLinkWorkers(py string, idle func() bool, log *slog.Logger) *linkWorkers {
	return &linkWorkers{py: py, idle: idle, log: log, stopc: make(chan struct{}), poll: 250 * time.Millisecond}
}

// take hands over the warm worker, if one is there and usable, and
// starts its replacement in the background. why says why none was
// (for the log).
func (p *linkWorkers) take() (w *linkWorker, why string) {
	p.mu.Lock()
	w, p.warm = p.warm, nil
	p.mu.Unlock()
	p.refill()
	switch {
	case w == nil:
		return nil, "no warm measurement process (still starting, or this node's first gang: the agent starts one after it)"
	case !w.alive():
		why = "the warm measurement process had exited: " + w.exitReason()
		w.stop()
		return nil, why
	case time.Since(w.started) > linkWorkerMaxAge:
		w.stop()
		return nil, fmt.Sprintf("the warm measurement process was older than %s", linkWorkerMaxAge)
	}
	return w, ""
}

// refill starts the next warm worker once the node has no run in
// progress, unless one is there, being started, or the pool stopped.
func (p *linkWorkers) refill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.warm != nil || p.refilling {
		return
	}
	p.refilling = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.poll)
		defer t.Stop()
		for !p.idle() {
			select {
			case <-p.stopc:
				p.mu.Lock()
				p.refilling = false
				p.mu.Unlock()
				return
			case <-t.C:
			}
		}
		w, err := startLinkWorker(p.py)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.refilling = false
		switch {
		case err != nil:
			p.log.Warn("starting the warm link measurement process; gangs start one each", "python", p.py, "err", err)
		case p.stopped:
			go w.stop()
		default:
			p.warm = w
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				select {
				case <-w.ready:
					// Read by the bench (scripts/bench.d/48-ddp.sh) to
					// let the node settle between rounds.
					p.log.Info("warm link measurement process ready", "pid", w.pid, "took", time.Since(w.started).Round(time.Millisecond))
				case <-w.done:
				}
			}()
		}
	}()
}

// stop ends the warm worker and any refill, and waits for both.
func (p *linkWorkers) stop() {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		close(p.stopc)
	}
	w := p.warm
	p.warm = nil
	p.mu.Unlock()
	if w != nil {
		w.stop()
	}
	p.wg.Wait()
}

// pid is the warm worker's process id, 0 with none (for tests).
func (p *linkWorkers) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.warm == nil {
		return 0
	}
	return p.warm.pid
}

// capped keeps the last max bytes written to it: the result is the
// last line, after whatever torch warned.
type capped struct {
	mu  sync.Mutex
	b   []byte
	max int
	// line, when set, is closed at the first end of line written.
	line chan struct{}
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.line != nil && bytes.IndexByte(p, '\n') >= 0 {
		close(c.line)
		c.line = nil
	}
	c.b = append(c.b, p...)
	if over := len(c.b) - c.max; over > 0 {
		c.b = append(c.b[:0], c.b[over:]...)
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.b)
}
