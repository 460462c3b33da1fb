package slurm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
)

// TestGangScript (issue #34): the gang's batch script runs one srun task
// per node with --kill-on-bad-exit, wrapped by rendezvous.SlurmTask; each
// node's task runs in its own rank's work dir, writes its own rank's
// files and gets its rank's environment; placement pins the ranks'
// nodes in rank order.
func TestGangScript(t *testing.T) {
	t.Parallel()
	env := func(alloc, rank string, extra ...string) []string {
		return append([]string{"PATH=/usr/bin", "GPUPASS_ALLOC_ID=" + alloc, "GPUPASS_NNODES=2", "GPUPASS_NODE_RANK=" + rank,
			"RANK=" + rank, "GPUPASS_MASTER_PORT=29501", "MASTER_ADDR=10.0.0.1", executor.EnvGangRun + "=run-1"}, extra...)
	}
	gj := &gangJob{nodes: 2, ranks: map[int]gangRank{
		0: {node: "n2", base: "/shared/n2/run-1/.slurm/attempt-1", a: executor.Attempt{Dir: "/shared/n2/run-1", Env: env("run-1", "0", "ONLY0=x")}},
		1: {node: "n1", base: "/shared/n1/run-1-r1/.slurm/attempt-1", a: executor.Attempt{Dir: "/shared/n1/run-1-r1", Env: env("run-1-r1", "1", "ONLY1=it's")}},
	}}
	a := gj.ranks[0].a
	a.Command = []string{"/usr/bin/python3", "train_ddp.py", "--steps", "60"}
	body, place, err := gangScript(a, gj, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(place, " "), "-w n2,n1 -N2 --ntasks-per-node=1"; got != want {
		t.Errorf("placement %q, want %q", got, want)
	}
	for _, want := range []string{
		"exec srun -N 2 --ntasks-per-node=1 --kill-on-bad-exit=1 --input=none '/bin/sh' '-c' 'set -e",
		"GPUPASS_MASTER_PORT=${GPUPASS_MASTER_PORT:-29501}",
		`'\''n1'\'')`,
		`cd '\''/shared/n1/run-1-r1'\'' || exit 127`,
		`exec >>'\''/shared/n1/run-1-r1/.slurm/attempt-1.out'\'' 2>>'\''/shared/n1/run-1-r1/.slurm/attempt-1.err'\''`,
		`GPUPASS_ALLOC_ID='\''run-1-r1'\''; export GPUPASS_ALLOC_ID`,
		`RANK='\''1'\''; export RANK`,
		`ONLY1='\''it'\''\'\'''\''s'\''; export ONLY1`,
		"unset ONLY0",
		"'/usr/bin/python3' 'train_ddp.py' '--steps' '60'",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the batch script has no %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, "PATH='") {
		t.Errorf("the script exports a variable every rank has alike:\n%s", body)
	}
	if _, _, err := gangScript(a, gj, "n1"); err == nil {
		t.Error("a gang whose rank 0 is on another node than the runner's was scripted")
	}
}

// TestFailedTask: the rank srun names first is the one that failed; the
// tasks it killed for it (--kill-on-bad-exit) come after.
func TestFailedTask(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "attempt-1.err")
	log := "trainer: something\nsrun: error: n2: task 1: Killed\nsrun: Job step aborted\nsrun: error: n1: task 0: Terminated\n"
	if err := os.WriteFile(p, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	node, task, what := failedTask(p, nil)
	if node != "n2" || task != "1" || what != "Killed" {
		t.Errorf("failedTask: %q %q %q, want n2 1 Killed", node, task, what)
	}
	if node, _, _ := failedTask(filepath.Join(t.TempDir(), "none"), nil); node != "" {
		t.Errorf("failedTask of no file: %q", node)
	}
	// The file is the job's to write (as the run's uid, read by the
	// agent as root): a link to another file is not read.
	ln := filepath.Join(t.TempDir(), "attempt-2.err")
	if err := os.Symlink(p, ln); err != nil {
		t.Fatal(err)
	}
	if node, _, _ := failedTask(ln, nil); node != "" {
		t.Errorf("failedTask read through a symbolic link: %q", node)
	}
	if node, _, _ := failedTask(p, &executor.RunAs{UID: uint32(os.Getuid()) + 1}); node != "" {
		t.Errorf("failedTask read a file of another user than the job's: %q", node)
	}
	// Only the end of a long file is read, where srun's line is.
	big := filepath.Join(t.TempDir(), "attempt-3.err")
	if err := os.WriteFile(big, append([]byte(strings.Repeat("x", 3<<20)+"\n"), log...), 0o644); err != nil {
		t.Fatal(err)
	}
	if node, _, _ := failedTask(big, nil); node != "n2" {
		t.Errorf("failedTask of a long file: %q, want n2", node)
	}
}

// TestGangHubJoin: ranks that join at once (each node's agent runs its
// own) make one gang, complete when the last joined; a rank joining twice
// or with another node count is refused.
func TestGangHubJoin(t *testing.T) {
	t.Parallel()
	h := newGangHub()
	const n = 8
	gangs := make(chan *gangJob, n)
	for r := range n {
		go func() {
			g, err := h.join("run-1/1", n, r, gangRank{node: "n" + string(rune('a'+r))})
			if err != nil {
				t.Error(err)
			}
			gangs <- g
		}()
	}
	first := <-gangs
	for range n - 1 {
		if g := <-gangs; g != first {
			t.Fatal("ranks of one run joined different gangs")
		}
	}
	select {
	case <-first.all:
	default:
		t.Fatal("every rank joined, but the gang is not complete")
	}
	if _, err := h.join("run-1/1", n, 3, gangRank{node: "nx"}); err == nil || !strings.Contains(err.Error(), "joined twice") {
		t.Errorf("a rank joining twice: %v", err)
	}
	if _, err := h.join("run-1/1", 2, 9, gangRank{node: "ny"}); err == nil || !strings.Contains(err.Error(), "says 2 nodes") {
		t.Errorf("a rank with another node count: %v", err)
	}
	h.leave("run-1/1")
	g, err := h.join("run-1/1", 2, 0, gangRank{node: "na"})
	if err != nil || g == first {
		t.Errorf("after rank 0 left, a join makes a new gang: %v", err)
	}
}

// TestGangRunAs: a rank of a gang given a uid of its own is taken (an
// agent with one run-as user gives every rank the same, one with a uid
// range the uid the gang's ranks share), and rank 0, once every rank
// joined, refuses to submit the one batch job when the ranks' uids
// differ, saying why; a runner with no gang hub takes no rank.
func TestGangRunAs(t *testing.T) {
	t.Parallel()
	g := gangInfo{run: "alloc-a", rank: 1, nodes: 2, port: 29500}
	user := &syscall.Credential{Uid: 70001, Gid: 70001, Groups: []uint32{70001}}
	if err := g.refuse(executor.Attempt{Credential: user}, newGangHub()); err != nil {
		t.Errorf("a rank run as the agent's run-as user: %v", err)
	}
	if err := g.refuse(executor.Attempt{}, newGangHub()); err != nil {
		t.Errorf("a rank without a uid of its own: %v", err)
	}
	if err := g.refuse(executor.Attempt{Credential: user}, nil); err == nil || !strings.Contains(err.Error(), "no gang hub") {
		t.Errorf("a runner with no gang hub: %v", err)
	}
	gang := func(creds ...*syscall.Credential) *gangJob {
		gj := &gangJob{nodes: len(creds), ranks: map[int]gangRank{}}
		for i, c := range creds {
			var same *syscall.Credential
			if c != nil {
				same = &syscall.Credential{Uid: c.Uid, Gid: c.Gid, Groups: slices.Clone(c.Groups)}
			}
			gj.ranks[i] = gangRank{node: fmt.Sprintf("n%d", i+1), a: executor.Attempt{Credential: same}}
		}
		return gj
	}
	for _, tc := range []struct {
		name  string
		creds []*syscall.Credential
		want  []string // nil: submitted
	}{
		{"one run-as user", []*syscall.Credential{user, user, user}, nil},
		{"the agent's own user", []*syscall.Credential{nil, nil}, nil},
		{"ranks of other uids", []*syscall.Credential{user, user, {Uid: 70002, Gid: 70002, Groups: []uint32{70002}}},
			[]string{"rank 0 as uid 70001 (gid 70001), rank 2 as uid 70002 (gid 70002)", "sbatch -N 3", "one uid", "not submitted"}},
		{"other groups", []*syscall.Credential{user, {Uid: 70001, Gid: 70001}}, []string{"different users"}},
		{"a rank as the agent's user", []*syscall.Credential{user, nil}, []string{"rank 1 as the agent's own user"}},
	} {
		err := gang(tc.creds...).oneUser()
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: the gang's job would be submitted", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: the refusal %q does not say %q", tc.name, err, w)
			}
		}
	}
}

// TestGangJobParsed: a gang's job names its batch host and every node
// it holds (RunJobsOn finds it on each, so a restarted agent does not
// measure a node of the gang with a step that would wait for the job's
// end), and its stderr file, where srun names a failed task.
func TestGangJobParsed(t *testing.T) {
	t.Parallel()
	j := ParseJobs("JobId=9 JobName=gpupass-alloc-a JobState=RUNNING Reason=None ExitCode=0:0 Partition=gpu NodeList=n[1-2] BatchHost=n1 StdErr=/shared/gpupass/c/n1/runs/alloc-a/.slurm/attempt-1.err")[0]
	if j.Node != "n1" || j.NodeList != "n[1-2]" || j.StdErr != "/shared/gpupass/c/n1/runs/alloc-a/.slurm/attempt-1.err" {
		t.Errorf("node %q, node list %q, stderr %q", j.Node, j.NodeList, j.StdErr)
	}
	if p := ParseJobs("JobId=7 JobName=x JobState=PENDING Reason=Resources ExitCode=0:0 Partition=gpu NodeList=(null) BatchHost=(null)")[0]; p.Node != "" || p.NodeList != "" {
		t.Errorf("a pending job: node %q, node list %q, want none", p.Node, p.NodeList)
	}
}

// TestRunJobsOnPending: a gpupass job pending for a node (pinned to it
// with sbatch -w, not started yet) holds the node as a running one does:
// an agent restarted right after it submitted a gang's job reuses its
// last measurement instead of queueing a measurement step behind the job
// (CI: the step waited out its 30 s, the agent went unheard, and the
// broker failed the gang with "node lost"). Other users' jobs, jobs
// pinned elsewhere and ended jobs do not.
func TestRunJobsOnPending(t *testing.T) {
	t.Parallel()
	jobs := ParseJobs(strings.Join([]string{
		"JobId=5 JobName=gpupass-alloc-g JobState=PENDING Reason=None ExitCode=0:0 Partition=gpu NodeList=(null) ReqNodeList=n[1-2] BatchHost=(null)",
		"JobId=6 JobName=gpupass-alloc-o JobState=PENDING Reason=Resources ExitCode=0:0 Partition=gpu NodeList=(null) ReqNodeList=n3 BatchHost=(null)",
		"JobId=7 JobName=someone-else JobState=PENDING Reason=None ExitCode=0:0 Partition=gpu NodeList=(null) ReqNodeList=n1 BatchHost=(null)",
		"JobId=8 JobName=gpupass-alloc-r JobState=RUNNING Reason=None ExitCode=0:0 Partition=gpu NodeList=n2 BatchHost=n2",
		"JobId=9 JobName=gpupass-alloc-e JobState=COMPLETED Reason=None ExitCode=0:0 Partition=gpu NodeList=n1 ReqNodeList=n1 BatchHost=n1",
	}, "\n"))
	expand := func(list string) []string {
		if list == "n[1-2]" {
			return []string{"n1", "n2"}
		}
		return []string{list}
	}
	ids := func(js []Job) string {
		var out []string
		for _, j := range js {
			out = append(out, j.ID)
		}
		return strings.Join(out, ",")
	}
	for node, want := range map[string]string{"n1": "5", "n2": "5,8", "n3": "6", "n4": ""} {
		if got := ids(runJobsOn(slices.Clone(jobs), node, expand)); got != want {
			t.Errorf("gpupass jobs holding %s: %q, want %q", node, got, want)
		}
	}
}
