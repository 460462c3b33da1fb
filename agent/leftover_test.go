package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/testutil"
)

// attackPy is run 1's job: a daemon that leaves its process group (fork,
// setsid, fork), ignores SIGTERM and SIGHUP, and once its run is over
// looks for the next run through /proc/PID/cwd and by path, appends a
// forged point to its metrics file and plants a file in its TMPDIR.
// Targets are limited to this test's runs dir.
const attackPy = `import os, sys, signal, time
pidfile, nxt = sys.argv[1], sys.argv[2]
if os.fork():
    while not (os.path.exists(pidfile) and os.path.getsize(pidfile) > 0):
        time.sleep(0.01)
    print("daemon started")
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
for s in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
fd = os.open(os.devnull, os.O_RDWR)
for i in (0, 1, 2):
    os.dup2(fd, i)
mine = os.getcwd()
runs = os.path.dirname(mine)
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(pidfile + ".tmp", pidfile)
while True:
    targets = [os.path.join(runs, nxt, "metrics.jsonl")]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cwd = os.readlink("/proc/%s/cwd" % p)
            except OSError:
                continue
            if cwd != mine and cwd.startswith(runs + "/"):
                targets.append("/proc/%s/cwd/metrics.jsonl" % p)
    for t in targets:
        try:
            if os.path.exists(t):
                with open(t, "a") as f:
                    f.write('{"step":999,"loss":0.001}\n')
        except OSError:
            pass
    try:
        with open(os.path.join(runs, ".tmp-" + nxt, "planted"), "w") as f:
            f.write("x")
    except OSError:
        pass
    time.sleep(0.05)
`

// endWatch calls onEnd as a run's terminal state reaches the broker.
type endWatch struct {
	*memSource
	onEnd func()
}

func (e *endWatch) UpdateAllocation(ctx context.Context, u AllocUpdate) (bool, error) {
	switch u.State {
	case StateSucceeded, StateFailed, StateCancelled:
		e.onEnd()
	}
	return e.memSource.UpdateAllocation(ctx, u)
}

// A process a job leaves behind (fork, setsid, fork; deaf to SIGTERM and
// SIGHUP) is gone when its run's end is reported, so it cannot reach the
// next run: that run's metrics hold only its own point and its TMPDIR
// only its own files. With a cgroup per run (here under one shared
// --run-as uid) and with a uid per run (--run-as-range, no cgroup: the
// uid alone must hold the run).
func TestLeftoverProcessCannotReachTheNextRun(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	for _, tc := range []struct {
		name   string
		uids   string // --run-as-range; "" is --run-as nobody
		cgroup bool
	}{
		{"run-as nobody with a cgroup per run", "", true},
		{"run-as-range without cgroups", "230200-230209", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state := testutil.TempDirMode(t, 0o711)
			x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
			l := &RunLoop{
				AgentID: func() string { return "agent-1" }, Executor: x, StateDir: state, Python: "/usr/bin/python3",
				UpdateEvery: 20 * time.Millisecond, DrainTimeout: 10 * time.Second,
			}
			if tc.uids != "" {
				r, err := local.ParseUIDRange(tc.uids)
				if err != nil {
					t.Fatal(err)
				}
				l.RunAsRange = r
			} else {
				nobody, err := executor.LookupRunAs("nobody")
				if err != nil {
					t.Fatal(err)
				}
				l.RunAs = nobody
			}
			if tc.cgroup {
				cg, err := local.DetectCgroups(local.CgroupRoot, "test-"+strconv.Itoa(os.Getpid()))
				if err != nil {
					testutil.Missing(t, "a cgroup hierarchy the agent can use: %v", err)
				}
				t.Cleanup(func() { cg.RemoveParents() })
				x.Host = &local.Host{Cgroups: cg}
			}
			suffix := strconv.Itoa(len(tc.uids))
			first, next := "alloc-leftover-first-"+suffix, "alloc-leftover-next-"+suffix
			pidFile := filepath.Join(state, "runs", first, "daemon.pid")
			readPid := func() int {
				b, _ := os.ReadFile(pidFile)
				n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return n
			}
			t.Cleanup(func() {
				if pid := readPid(); pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			var (
				once       sync.Once
				aliveAtEnd bool
				pidAtEnd   int
			)
			src1 := &endWatch{memSource: newMemSource(), onEnd: func() {
				once.Do(func() { pidAtEnd = readPid(); aliveAtEnd = pidAtEnd > 0 && testutil.PIDAlive(pidAtEnd) })
			}}
			l.Source = src1
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			job1 := "id -u\necho \"tmp=$TMPDIR\"\n/usr/bin/python3 attack.py daemon.pid " + next + "\n"
			a := Assignment{AllocID: first, FencingToken: 1, Command: []string{"sh", "job.sh"},
				Workdir: tarball(t, map[string]string{"job.sh": job1, "attack.py": attackPy})}
			if final := l.RunAssignment(ctx, &a); final.State != StateSucceeded {
				t.Fatalf("run 1 %s: %s", final.State, final.Reason)
			}
			msgs1 := src1.messages(t)
			if !contains(msgs1, "daemon started") || pidAtEnd == 0 {
				t.Fatalf("run 1's daemon did not start (pid %d); events: %q", pidAtEnd, msgs1)
			}
			if aliveAtEnd {
				t.Errorf("run 1's daemon (pid %d) was alive when run 1's end was reported", pidAtEnd)
			}

			// Run 2 starts after run 1's end was reported; it lives long
			// enough for a surviving daemon to find it.
			src2 := newMemSource()
			l.Source = src2
			job2 := "id -u\necho \"tmp=$TMPDIR\"\necho '{\"step\":1,\"loss\":0.5}' >> \"$GPUPASS_METRICS_FILE\"\nsleep 3\necho \"tmp-content:$(ls -A \"$TMPDIR\")\"\n"
			b := Assignment{AllocID: next, FencingToken: 1, Command: []string{"sh", "job.sh"}, Workdir: tarball(t, map[string]string{"job.sh": job2})}
			if final := l.RunAssignment(ctx, &b); final.State != StateSucceeded {
				t.Fatalf("run 2 %s: %s", final.State, final.Reason)
			}
			msgs2 := src2.messages(t)
			var own, forged int
			src2.mu.Lock()
			for _, r := range src2.recs {
				if r.Kind == spool.KindMetric {
					m, err := executor.DecodeMetric(r)
					if err != nil {
						t.Fatal(err)
					}
					if m.Step == 1 {
						own++
					} else {
						forged++
					}
				}
			}
			src2.mu.Unlock()
			if own != 1 || forged != 0 {
				t.Errorf("run 2 has %d metric points of its own and %d forged ones, want 1 and 0", own, forged)
			}
			if contains(msgs2, "planted") {
				t.Errorf("run 1's daemon wrote into run 2's TMPDIR; events: %q", msgs2)
			}
			uid1, tmp1 := jobLines(msgs1)
			uid2, tmp2 := jobLines(msgs2)
			if tmp1 == "" || tmp2 == "" || tmp1 == tmp2 {
				t.Errorf("TMPDIRs %q and %q, want one of each run's own", tmp1, tmp2)
			}
			if sameUID := uid1 == uid2; sameUID != (tc.uids == "") || uid1 == "" {
				t.Errorf("run 1 ran as uid %q, run 2 as %q; want the same uid only with --run-as", uid1, uid2)
			}
		})
	}
}

// jobLines finds the uid (a line of digits) and the TMPDIR a job printed.
func jobLines(msgs []string) (uid, tmp string) {
	for _, m := range msgs {
		for l := range strings.Lines(m) {
			l = strings.TrimSpace(l)
			if v, ok := strings.CutPrefix(l, "tmp="); ok && tmp == "" {
				tmp = v
			} else if l != "" && strings.Trim(l, "0123456789") == "" && uid == "" {
				uid = l
			}
		}
	}
	return uid, tmp
}

// Not parallel: it replaces geteuid, which parallel tests' Validate reads.
func TestRunAsRangeFlags(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	geteuid = func() int { return 0 }
	for _, tc := range []struct {
		name string
		o    Options
		want string // "" is valid
	}{
		{"range", Options{RunAsRange: "200000-200999"}, ""},
		{"range and run-as", Options{RunAsRange: "200000-200999", RunAs: "nobody"}, `job user "nobody" and job uid range "200000-200999" exclude each other: give one`},
		{"bad range", Options{RunAsRange: "0-5"}, "includes uid 0"},
		{"bad cgroup mode", Options{RunCgroup: "yes"}, `run cgroup "yes": use auto, required or off`},
		{"negative pids", Options{RunPidsMax: -1}, `run pids max "-1"`},
		{"bad private tmp mode", Options{RunPrivateTmp: "yes"}, `run private tmp "yes": use auto, required or off`},
		{"bad shm size", Options{RunShmSize: "16gb"}, `run shm size "16gb": not a size`},
		{"short kill timeout", Options{RunKillTimeout: time.Millisecond}, `run kill timeout "1ms": must be at least 1s`},
	} {
		o := tc.o
		o.StorageClass, o.SuiteInterval = "standard", time.Hour
		err := o.Validate(false)
		switch {
		case tc.want == "" && (err != nil || o.runAsRange == nil || o.RunCgroup != "auto" || o.RunKillTimeout != local.DefaultKillTimeout || o.RunPrivateTmp != "auto" || o.RunShmSize != local.DefaultShmSize):
			t.Errorf("%s: Validate = %v (range %v, cgroup %q, kill timeout %s, private tmp %q, shm size %q), want it valid with defaults", tc.name, err, o.runAsRange, o.RunCgroup, o.RunKillTimeout, o.RunPrivateTmp, o.RunShmSize)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
	geteuid = func() int { return 1000 }
	o := &Options{StorageClass: "standard", SuiteInterval: time.Hour, RunAsRange: "200000-200999"}
	if err := o.Validate(false); err == nil || !strings.Contains(err.Error(), `job uid range "200000-200999": starting jobs as other users`+" needs the agent to run as root (it runs as uid 1000)") {
		t.Errorf("Validate as uid 1000 = %v, want the root requirement", err)
	}
}
