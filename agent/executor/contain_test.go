package executor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/testutil"
)

// escapeScript starts a daemon the way a job escapes its process group
// (fork, setsid, fork), deaf to SIGTERM and SIGHUP, that writes its pid
// to pidFile and lives on; the job itself exits 0 at once.
func escapeScript(pidFile string) string {
	return `touch /dev/shm/gpupass-test-$(id -u) /tmp/gpupass-test-$(id -u)
setsid sh -c 'trap "" TERM HUP; sh -c "trap \"\" TERM HUP; echo \$\$ > ` + pidFile + `; exec sleep 300" & ' </dev/null >/dev/null 2>&1
while [ ! -s ` + pidFile + ` ]; do sleep 0.01; done
echo "tmp=$TMPDIR $(stat -c '%a:%u' "$TMPDIR") uid=$(id -u)"
`
}

// cgroups is this node's cgroup hierarchy for runs; the test fails with
// CI=true when there is none (CI runs as root on a node with one).
func cgroups(t *testing.T) *local.Cgroups {
	t.Helper()
	testutil.NeedRoot(t)
	// A parent of its own: TestReapAfterAgentRestart reaps every run
	// under its parent.
	name := fmt.Sprintf("test-%d-%s", os.Getpid(), strings.NewReplacer("/", "_", ".", "_").Replace(t.Name()))
	cg, err := local.DetectCgroups(local.CgroupRoot, name)
	if err != nil {
		testutil.Missing(t, "a cgroup hierarchy the agent can use (v2, or v1 freezer): %v", err)
	}
	t.Cleanup(func() { cg.RemoveParents() }) // the last test's succeeds
	return cg
}

// An agent killed during a run leaves what the run started; the next
// agent process kills it at start: the processes in its runs' cgroups
// and those holding a uid of its range.
func TestReapAfterAgentRestart(t *testing.T) {
	t.Parallel()
	cg := cgroups(t)
	g, err := cg.New("alloc-reap-test")
	if err != nil {
		t.Fatal(err)
	}
	inCgroup := exec.Command("sleep", "300")
	if err := inCgroup.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { inCgroup.Process.Kill(); inCgroup.Wait() }()
	for _, p := range cg.Parents {
		if err := os.WriteFile(filepath.Join(p, "alloc-reap-test", "cgroup.procs"), []byte(strconv.Itoa(inCgroup.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	r, err := local.ParseUIDRange("230300-230309")
	if err != nil {
		t.Fatal(err)
	}
	ofUID := exec.Command("sleep", "300")
	ofUID.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 230304, Gid: 230304}}
	if err := ofUID.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { ofUID.Process.Kill(); ofUID.Wait() }()

	if err := cg.Reap(); err != nil {
		t.Fatal(err)
	}
	if err := r.Reap(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*exec.Cmd{inCgroup, ofUID} {
		if err := c.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("%s (pid %d): %v, want killed", c, c.Process.Pid, err)
		}
	}
	if procs, err := g.Procs(); err == nil {
		t.Errorf("the run's cgroup is still there (members %v)", procs)
	}
}

// A process that left its process group (fork, setsid, fork) and
// ignores SIGTERM does not outlive its run: with a uid of the run's own,
// with a cgroup (here a shared uid, so only the cgroup holds it), and
// with both. The run's TMPDIR is the job's, 0700, and gone at the end.
func TestRunLeavesNoProcessBehind(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		uids   string // --run-as-range; "" runs as nobody
		cgroup bool
	}{
		{"own uid", "230000-230009", false},
		{"cgroup", "", true},
		{"own uid and cgroup", "230010-230019", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
			if tc.cgroup {
				x.Host = &local.Host{Cgroups: cgroups(t)}
			}
			runAs := nobody
			if tc.uids != "" {
				r, err := local.ParseUIDRange(tc.uids)
				if err != nil {
					t.Fatal(err)
				}
				if runAs, err = r.Acquire(); err != nil {
					t.Fatal(err)
				}
			}
			root := testutil.TempDirMode(t, 0o711)
			pidFile := filepath.Join(root, "daemon.pid")
			if err := os.WriteFile(pidFile, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			os.Chmod(pidFile, 0o666)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			alloc := "alloc-leave-" + strings.ReplaceAll(tc.name, " ", "-")
			job := executor.Job{AllocID: alloc, Command: []string{"/bin/sh", "-c", escapeScript(pidFile)}, WorkRoot: filepath.Join(root, "runs"), RunAs: runAs}
			out := execute(t, ctx, job, x)
			pid := readPid(t, pidFile)
			alive := testutil.PIDAlive(pid)
			if alive {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			if out.res.State != executor.Succeeded {
				t.Fatalf("run %s: %s\n%s", out.res.State, out.res.Reason, lines(out.events))
			}
			if alive {
				t.Fatalf("the daemon (pid %d) outlived its run", pid)
			}
			tmp := filepath.Join(root, "runs", ".tmp-"+alloc)
			want := fmt.Sprintf("tmp=%s 700:%d uid=%d", tmp, runAs.UID, runAs.UID)
			if got := lines(out.find("stdout")); !strings.Contains(got, want) {
				t.Errorf("job output %q, want %q (a TMPDIR of the run's own, 0700)", got, want)
			}
			if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the run's TMPDIR is still there after it: %v", err)
			}
			// What the run left in /tmp and /dev/shm goes too: all a uid
			// of the run's own holds there, and what a shared uid added
			// during the run.
			for _, d := range []string{"/dev/shm", "/tmp"} {
				p := filepath.Join(d, fmt.Sprintf("gpupass-test-%d", runAs.UID))
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s after the run: %v; want it removed", p, err)
					os.Remove(p)
				}
			}
		})
	}
}

// A NaN restart starts the next attempt only when nothing of the one
// before is left: the daemon attempt 1 left behind is gone when attempt 2
// looks (a zombie, which init has not reaped yet, counts as gone).
func TestNaNRestartWaitsForTheAttemptsProcesses(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	r, err := local.ParseUIDRange("230020-230029")
	if err != nil {
		t.Fatal(err)
	}
	runAs, err := r.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	root := testutil.TempDirMode(t, 0o711)
	pidFile := filepath.Join(root, "daemon.pid")
	if err := os.WriteFile(pidFile, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(pidFile, 0o666)
	script := `if [ "$GPUPASS_ATTEMPT" = 1 ]; then
` + escapeScript(pidFile) + `
echo '{"step":1,"loss":NaN}' >> "$GPUPASS_METRICS_FILE"; sleep 300
else
state=$(cut -d' ' -f3 /proc/$(cat ` + pidFile + `)/stat 2>/dev/null)
if [ -n "$state" ] && [ "$state" != Z ]; then echo "daemon-alive $state"; else echo daemon-gone; fi
fi
`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	job := executor.Job{AllocID: "alloc-nan-leftover", Command: []string{"/bin/sh", "-c", script}, WorkRoot: filepath.Join(root, "runs"), RunAs: runAs, MaxRestarts: 1, Grace: time.Second}
	out := execute(t, ctx, job, &executor.Executor{MetricsPoll: 10 * time.Millisecond})
	pid := readPid(t, pidFile)
	if testutil.PIDAlive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the daemon (pid %d) outlived its run", pid)
	}
	stdout := lines(out.find("stdout"))
	if out.res.Restarts != 1 || !strings.Contains(stdout, "daemon-gone") || strings.Contains(stdout, "daemon-alive") {
		t.Fatalf("run %s (%s), %d restarts; output:\n%s", out.res.State, out.res.Reason, out.res.Restarts, stdout)
	}
}

// The run's cgroup on this node's hierarchy (v1 freezer and pids here,
// v2 on most production nodes): the command starts in it, so a daemon
// that left its session is killed with it, the cgroup is empty after
// Run, and the agent's forking thread went back (else Remove would fail:
// a cgroup with a member cannot be removed).
func TestCgroupHoldsTheRun(t *testing.T) {
	t.Parallel()
	cg := cgroups(t)
	if v := os.Getenv("GPUPASS_TEST_CGROUP_VERSION"); v != "" && strconv.Itoa(cg.Version) != v {
		t.Fatalf("cgroup v%d found, want v%s (GPUPASS_TEST_CGROUP_VERSION)", cg.Version, v)
	}
	t.Logf("%s", cg)
	g, err := cg.New("alloc-cgroup-test")
	if err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(t.TempDir(), "daemon.pid")
	t.Cleanup(func() { os.Remove("/dev/shm/gpupass-test-0"); os.Remove("/tmp/gpupass-test-0") }) // escapeScript's, as root
	var text []string
	ex := local.ProcessRunner{}.Run(context.Background(), executor.Attempt{
		Command: []string{"sh", "-c", escapeScript(pidFile) + "cat /proc/self/cgroup"},
		Env:     []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=/tmp"},
		Contain: &local.Containment{Cgroup: g},
	}, func(l executor.Line) { text = append(text, l.Text) })
	pid := readPid(t, pidFile)
	if testutil.PIDAlive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the daemon (pid %d) outlived the attempt (%+v)", pid, ex)
	}
	if ex.Code != 0 || ex.Leftover != nil {
		t.Fatalf("exit %+v; output %q", ex, text)
	}
	if !strings.Contains(strings.Join(text, "\n"), "/gpupass-runs/"+filepath.Base(cg.Parents[0])+"/alloc-cgroup-test") {
		t.Errorf("the command did not start in the run's cgroup: %q", text)
	}
	if procs, err := g.Procs(); err != nil || len(procs) != 0 {
		t.Errorf("cgroup after the run: %v, %v; want empty", procs, err)
	}
	if err := g.Remove(); err != nil {
		t.Errorf("removing the cgroup: %v", err)
	}
}

// A job that forks as fast as it can is frozen, so the kill does not
// race it, and killed whole.
func TestCgroupKillsAForkingJob(t *testing.T) {
	t.Parallel()
	cg := cgroups(t)
	cg.PidsMax = 200 // and pids.max keeps it from taking the node
	g, err := cg.New("alloc-cgroup-forks")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ready sync.Once
	ex := local.ProcessRunner{}.Run(ctx, executor.Attempt{
		Command: []string{"sh", "-c", `trap "" TERM HUP; i=0; while [ $i -lt 5 ]; do (setsid sh -c 'trap "" TERM HUP; while :; do sleep 0.01 & done' &) ; i=$((i+1)); done; echo ready; sleep 300`},
		Grace:   100 * time.Millisecond,
		Contain: &local.Containment{Cgroup: g},
	}, func(l executor.Line) {
		if l.Text == "ready" {
			ready.Do(cancel)
		}
	})
	if ex.Leftover != nil {
		t.Fatalf("leftover: %v", ex.Leftover)
	}
	if procs, err := g.Procs(); err != nil || len(procs) != 0 {
		t.Errorf("cgroup after the run: %v, %v; want empty", procs, err)
	}
}

// The range hands out a uid no run holds and no process has, never the
// same one twice while held, and never again one that a process still
// held when its run gave it back.
func TestUIDRange(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"0-10":              "includes uid 0",
		"5-5":               "LAST must be above FIRST",
		"10-5":              "LAST must be above FIRST",
		"200000":            "want FIRST-LAST",
		"a-b":               "want FIRST-LAST",
		"1-4294967295":      "out of range",
		"100-99999999":      "more than",
		"200000-200009:":    "want FIRST-LAST",
		"200000-200009:0":   "group 0",
		"200000-200009:no-": "no such group",
	} {
		_, err := local.ParseUIDRange(in)
		var fe *fielderr.Error
		if !errors.As(err, &fe) || fe.Field != executor.FieldUIDRange || fe.Value != in || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseUIDRange(%q) = %v, want a %q field error that says %q", in, err, executor.FieldUIDRange, want)
		}
	}
	g, err := local.ParseUIDRange("200000-200009:65534")
	if err != nil || g.Sample().GID != 65534 {
		t.Errorf("a shared group: %+v, %v", g, err)
	}

	testutil.NeedRoot(t)
	r, err := local.ParseUIDRange("230100-230102")
	if err != nil {
		t.Fatal(err)
	}
	// A leftover of some earlier run holds 230101.
	left := exec.Command("sleep", "300")
	left.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 230101, Gid: 230101}}
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { left.Process.Kill(); left.Wait() }()

	a, err := r.Acquire()
	if err != nil || a.UID != 230100 || a.GID != 230100 || !a.Private || len(a.Groups) != 0 {
		t.Fatalf("first: %+v, %v; want uid and gid 230100, private, no groups", a, err)
	}
	b, err := r.Acquire()
	if err != nil || b.UID != 230102 {
		t.Fatalf("second: %+v, %v; want 230102 (230100 is held, 230101 has a process)", b, err)
	}
	if c, err := r.Acquire(); !errors.Is(err, local.ErrNoFreeUID) {
		t.Fatalf("third: %+v, %v; want no free uid", c, err)
	}
	if err := r.Release(a); err != nil {
		t.Fatal(err)
	}
	if c, err := r.Acquire(); err != nil || c.UID != 230100 {
		t.Fatalf("after release: %+v, %v; want 230100 again", c, err)
	}

	// A run gives back a uid a process still holds: never handed out
	// again, even once the process is gone.
	held := exec.Command("sleep", "300")
	held.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: b.UID, Gid: b.GID}}
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	err = r.Release(b)
	held.Process.Kill()
	held.Wait()
	if err == nil || !strings.Contains(err.Error(), "not reused") || !strings.Contains(err.Error(), strconv.Itoa(held.Process.Pid)) {
		t.Fatalf("Release with a process left = %v, want the uid refused, naming the process", err)
	}
	left.Process.Kill()
	left.Wait()
	if err := r.Release(&executor.RunAs{UID: 230100}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c, err := r.Acquire()
		if err != nil {
			break
		}
		if c.UID == b.UID {
			t.Fatalf("uid %d handed out again after a process outlived its run", b.UID)
		}
	}
}

// fakeGuard stands for a cluster the run's processes are on: uids it
// holds elsewhere, uids whose jobs do not end.
type fakeGuard struct {
	mu                     sync.Mutex
	elsewhere, stuck       map[uint32]bool
	claimed, ended, gaveUp []uint32
}

func (g *fakeGuard) Claim(uid uint32) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.elsewhere[uid] {
		return nil, fmt.Errorf("uid %d is another agent's", uid)
	}
	g.claimed = append(g.claimed, uid)
	return func() { g.mu.Lock(); g.gaveUp = append(g.gaveUp, uid); g.mu.Unlock() }, nil
}

func (g *fakeGuard) End(uid uint32) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ended = append(g.ended, uid)
	if g.stuck[uid] {
		return fmt.Errorf("job of uid %d still running", uid)
	}
	return nil
}

// With a Guard (a Slurm cluster's jobs), a uid another agent holds is
// skipped, a uid is given back only once its jobs there ended, and one
// whose jobs did not end is never handed out again, its claim kept.
func TestUIDRangeGuard(t *testing.T) {
	t.Parallel()
	r, err := local.ParseUIDRange("231100-231102")
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeGuard{elsewhere: map[uint32]bool{231100: true}, stuck: map[uint32]bool{231102: true}}
	r.Guard = g
	a, err := r.Acquire()
	if err != nil || a.UID != 231101 {
		t.Fatalf("first: %+v, %v; want 231101 (231100 is another agent's)", a, err)
	}
	b, err := r.Acquire()
	if err != nil || b.UID != 231102 {
		t.Fatalf("second: %+v, %v; want 231102", b, err)
	}
	if err := r.Release(a); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(b); err == nil || !strings.Contains(err.Error(), "uid 231102 not reused: job of uid 231102 still running") {
		t.Fatalf("Release with a job left = %v, want the uid refused", err)
	}
	if fmt.Sprint(g.ended) != "[231101 231102]" || fmt.Sprint(g.gaveUp) != "[231101]" {
		t.Errorf("ended %v, claims given up %v; want both ended, only 231101's claim given up", g.ended, g.gaveUp)
	}
	if _, err := r.Claim(231102); err == nil {
		t.Error("Claim of a spoiled uid succeeded")
	}
	if _, err := r.Claim(231000); err == nil {
		t.Error("Claim of a uid outside the range succeeded")
	}
	c, err := r.Claim(231101)
	if err != nil || c.UID != 231101 || !c.Private {
		t.Fatalf("Claim(231101) = %+v, %v; want the run's uid back", c, err)
	}
	if _, err := r.Claim(231101); err == nil {
		t.Error("a held uid was claimed twice")
	}
	for range 3 {
		if d, err := r.Acquire(); err == nil && (d.UID == 231102 || d.UID == 231101) {
			t.Fatalf("uid %d handed out while spoiled or held", d.UID)
		}
	}
}

// The ranks of a gang that one agent runs (a Slurm cluster's one job
// runs them all as one uid) share a uid under their key: claimed from
// the Guard once, no other key or run ever given it, and ended and given
// back only by the last rank's Release. An agent restarted under the
// gang claims it back for every rank the same way.
func TestUIDRangeShared(t *testing.T) {
	t.Parallel()
	r, err := local.ParseUIDRange("232100-232102")
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeGuard{}
	r.Guard = g
	rank0, err := r.AcquireShared("gang/x")
	if err != nil || rank0.UID != 232100 {
		t.Fatalf("rank 0: %+v, %v; want 232100", rank0, err)
	}
	rank1, err := r.AcquireShared("gang/x")
	if err != nil || rank1.UID != rank0.UID || rank1.GID != rank0.GID || !rank1.Private || !rank0.Shared || !rank1.Shared {
		t.Fatalf("rank 0 %+v, rank 1: %+v, %v; want rank 0's uid, both private and shared", rank0, rank1, err)
	}
	other, err := r.AcquireShared("gang/y")
	if err != nil || other.UID != 232101 {
		t.Fatalf("another gang: %+v, %v; want 232101", other, err)
	}
	single, err := r.Acquire()
	if err != nil || single.UID != 232102 || single.Shared {
		t.Fatalf("a run on one node: %+v, %v; want 232102", single, err)
	}
	if fmt.Sprint(g.claimed) != "[232100 232101 232102]" {
		t.Errorf("the guard's claims %v; want each uid claimed once", g.claimed)
	}
	if err := r.Release(rank0); err != nil {
		t.Fatal(err)
	}
	if len(g.ended) != 0 || len(g.gaveUp) != 0 {
		t.Fatalf("rank 0's release ended %v, gave up %v: rank 1's job still runs as the uid", g.ended, g.gaveUp)
	}
	if u, err := r.AcquireShared("gang/z"); !errors.Is(err, local.ErrNoFreeUID) {
		t.Fatalf("with rank 1 holding its gang's uid a third gang got %+v, %v; want no free uid", u, err)
	}
	if _, err := r.Claim(232100); err == nil {
		t.Error("a run of its own claimed the uid a gang holds")
	}
	if _, err := r.ClaimShared("gang/x", 232101); err == nil || !strings.Contains(err.Error(), "hold uid 232100") {
		t.Errorf("gang x claimed another gang's uid: %v", err)
	}
	if err := r.Release(rank1); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(g.ended) != "[232100]" || fmt.Sprint(g.gaveUp) != "[232100]" {
		t.Errorf("after the last rank's release: ended %v, claims given up %v; want 232100 ended and given up once", g.ended, g.gaveUp)
	}

	// An agent restarted under gang y: both ranks claim its uid back.
	if err := r.Release(other); err != nil {
		t.Fatal(err)
	}
	back0, err := r.ClaimShared("gang/y", 232101)
	if err != nil || back0.UID != 232101 {
		t.Fatalf("rank 0 of gang y claiming its uid back: %+v, %v", back0, err)
	}
	back1, err := r.ClaimShared("gang/y", 232101)
	if err != nil || back1.UID != 232101 {
		t.Fatalf("rank 1 of gang y claiming its uid back: %+v, %v; want it shared, not refused", back1, err)
	}
	if _, err := r.AcquireShared("gang/z"); err != nil {
		t.Fatalf("a third gang with 232100 free: %v", err)
	}
	for _, ra := range []*executor.RunAs{back0, back1} {
		if err := r.Release(ra); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(fmt.Sprint(g.ended), "232101"); n != 2 {
		t.Errorf("ended %v: want 232101 ended once per time it was given back whole (twice)", g.ended)
	}
}

// A uid a gang's ranks share is not killed when one rank's run ends
// (RunAs.Shared: the Host leaves it to the range), so the other ranks'
// processes live on; the last rank's Release kills what is left of it and
// hands it out again, as a run's own uid would be after its end.
func TestUIDRangeSharedKill(t *testing.T) {
	testutil.NeedRoot(t)
	r, err := local.ParseUIDRange("232200-232201")
	if err != nil {
		t.Fatal(err)
	}
	rank0, err := r.AcquireShared("gang/x")
	if err != nil {
		t.Fatal(err)
	}
	rank1, err := r.AcquireShared("gang/x")
	if err != nil {
		t.Fatal(err)
	}
	held, err := (&local.Host{}).Hold(executor.Job{AllocID: "alloc-r1", RunAs: rank1}, nil, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	task := exec.Command("sleep", "300")
	task.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: rank0.UID, Gid: rank0.GID}}
	if err := task.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- task.Wait() }()
	defer task.Process.Kill()
	// Rank 1's run ends: its hold's Kill and its Release.
	if err := held.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(rank1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		t.Fatalf("rank 0's process (uid %d) ended with rank 1's run: %v", rank0.UID, err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := r.Release(rank0); err != nil {
		t.Fatalf("the last rank's release: %v; want its uid's process killed and the uid handed out again", err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the gang's process lives on after its last rank released the uid")
	}
	for range 2 {
		if _, err := r.Acquire(); err != nil {
			t.Fatalf("the gang's uid was not handed out again: %v", err)
		}
	}
}
