package slurm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/executor/slurm"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperAgent())
	}
	os.Exit(slurmtest.Run(m))
}

func client(c *slurmtest.Cluster) *slurm.Client {
	return &slurm.Client{Env: []string{"SLURM_CONF=" + c.Conf}}
}

func TestParseNodes(t *testing.T) {
	t.Parallel()
	out := `NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=3.11 AvailableFeatures=ib,nvme ActiveFeatures=ib,nvme Gres=gpu:a100:4(S:0-1) NodeAddr=127.0.0.1 NodeHostName=localhost Port=16821 Version=22.05.8 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu,debug  Reason=bad dimm, see ticket 42=x [root@2026-12-02T03:53:33] CfgTRES=cpu=2,mem=1000M,billing=2
NodeName=n2 CPUTot=8 AvailableFeatures=(null) Gres=gpu:2 RealMemory=64000 State=MIXED Partitions=gpu
NodeName=n3 CPUTot=8 Gres=(null) State=DOWN*+NOT_RESPONDING Partitions=cpu Reason=Not responding [slurm@2026-12-01T00:00:00]
`
	got, err := slurm.ParseNodes(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []slurm.Node{
		{Name: "n1", State: "IDLE+DRAIN", Reason: "bad dimm, see ticket 42=x [root@2026-12-02T03:53:33]", GPUType: "a100", GPUs: 4, CPUs: 4, MemoryMB: 1000, Features: []string{"ib", "nvme"}, Partitions: []string{"gpu", "debug"}, Addr: "127.0.0.1"},
		{Name: "n2", State: "MIXED", GPUs: 2, CPUs: 8, MemoryMB: 64000, Partitions: []string{"gpu"}},
		{Name: "n3", State: "DOWN*+NOT_RESPONDING", Reason: "Not responding [slurm@2026-12-01T00:00:00]", CPUs: 8, Partitions: []string{"cpu"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("nodes (-want +got):\n%s", d)
	}
	for _, c := range []struct {
		n    slurm.Node
		want string
	}{
		{got[0], "slurm node n1 is drain: bad dimm, see ticket 42=x [root@2026-12-02T03:53:33]"},
		{got[1], ""},
		{got[2], "slurm node n3 is down+not_responding: Not responding [slurm@2026-12-01T00:00:00]"},
		{slurm.Node{Name: "m", State: "IDLE+MAINTENANCE+RESERVED"}, "slurm node m is maintenance"},
		{slurm.Node{Name: "f", State: "ALLOCATED+FAIL", Reason: "gpu xid 79"}, "slurm node f is fail: gpu xid 79"},
	} {
		if got := c.n.Unavailable(); got != c.want {
			t.Errorf("%s (%s): Unavailable() = %q, want %q", c.n.Name, c.n.State, got, c.want)
		}
	}
	if g := got[0].Gres(); g != "gpu:a100:4" {
		t.Errorf("Gres() = %q", g)
	}
}

func TestJobStates(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		line     string
		phase    slurm.Phase
		lost     bool
		describe string
	}{
		{"JobId=7 JobName=gpupass-alloc-a JobState=PENDING Reason=Resources ExitCode=0:0 Partition=gpu NodeList=(null) BatchHost=(null)", slurm.Pending, false, "slurm job 7 (partition gpu): PENDING (Resources)"},
		{"JobId=7 JobName=x JobState=RUNNING Reason=None ExitCode=0:0 Partition=gpu NodeList=n1 BatchHost=n1", slurm.Running, false, "slurm job 7 on n1 (partition gpu): RUNNING"},
		{"JobId=7 JobName=x JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 Partition=gpu NodeList=n1 BatchHost=n1", slurm.Ended, false, "slurm job 7 on n1 (partition gpu): FAILED (NonZeroExitCode, exit code 3)"},
		{"JobId=7 JobName=x JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 TimeLimit=00:01:00 Partition=gpu BatchHost=n1", slurm.Ended, false, "slurm job 7 on n1 (partition gpu): TIMEOUT (TimeLimit, time limit 00:01:00)"},
		{"JobId=7 JobName=x JobState=OUT_OF_MEMORY Reason=OutOfMemory ExitCode=0:125 Partition=gpu BatchHost=n1", slurm.Ended, false, "slurm job 7 on n1 (partition gpu): OUT_OF_MEMORY (OutOfMemory, exit code 0, signal 125)"},
		{"JobId=7 JobName=x JobState=NODE_FAIL Reason=NodeDown ExitCode=0:0 Partition=gpu BatchHost=n2", slurm.Ended, true, "slurm job 7 on n2 (partition gpu): NODE_FAIL (NodeDown)"},
		{"JobId=7 JobName=x JobState=PREEMPTED Reason=None ExitCode=0:0 Partition=gpu BatchHost=n2", slurm.Ended, true, "slurm job 7 on n2 (partition gpu): PREEMPTED"},
		{"JobId=7 JobName=x JobState=CANCELLED Reason=None ExitCode=0:15 Partition=gpu BatchHost=n2", slurm.Ended, false, "slurm job 7 on n2 (partition gpu): CANCELLED"},
		{"JobId=7 JobName=x JobState=COMPLETING Reason=None ExitCode=0:0 Partition=gpu BatchHost=n2", slurm.Running, false, "slurm job 7 on n2 (partition gpu): COMPLETING"},
	} {
		jobs := slurm.ParseJobs(c.line)
		if len(jobs) != 1 {
			t.Fatalf("%s: %d jobs", c.line, len(jobs))
		}
		j := jobs[0]
		if j.Phase() != c.phase || j.NodeLost() != c.lost || j.Describe() != c.describe {
			t.Errorf("%s:\n phase %v lost %v %q\nwant %v %v %q", c.line, j.Phase(), j.NodeLost(), j.Describe(), c.phase, c.lost, c.describe)
		}
	}
}

// TestJobOwnerAndEnd: the sweep tells the account's jobs by UserId's uid,
// and the end a file's change time is held against is EndTime (Unix
// seconds, Client asks for them), only once the job ended (a running
// job's EndTime is its projected end).
func TestJobOwnerAndEnd(t *testing.T) {
	t.Parallel()
	end := time.Unix(1796542205, 0)
	for _, c := range []struct {
		line string
		uid  int
		end  time.Time
	}{
		{"JobId=8 JobName=x UserId=svc-gpupass(1234) GroupId=svc(1234) JobState=COMPLETED ExitCode=0:0 EndTime=1796542205 BatchHost=n1", 1234, end},
		{"JobId=8 JobName=x UserId=root(0) JobState=RUNNING ExitCode=0:0 EndTime=1796542205 BatchHost=n1", 0, time.Time{}},
		{"JobId=8 JobName=x JobState=COMPLETED ExitCode=0:0 EndTime=Unknown BatchHost=n1", -1, time.Time{}},
	} {
		j := slurm.ParseJobs(c.line)[0]
		if j.UserID != c.uid || !j.EndTime.Equal(c.end) {
			t.Errorf("%s: uid %d end %v, want %d %v", c.line, j.UserID, j.EndTime, c.uid, c.end)
		}
	}
}

// TestJobEndIsTheInstantItEnded: the end a file's change time is held
// against does not hang on the zone Slurm's tools print local times in
// (here not the test's; on a login node, the hour a DST change repeats
// is two instants).
func TestJobEndIsTheInstantItEnded(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	cl := &slurm.Client{Env: []string{"SLURM_CONF=" + c.Conf, "TZ=XST-7"}}
	before := time.Now().Truncate(time.Second)
	id := strings.TrimSpace(c.Command(t, "sbatch", "--parsable", "-w", "n2", "-N1", "-n1", "--output", "/dev/null", "--wrap", "true"))
	var j slurm.Job
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if j, err = cl.Job(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if j.Phase() == slurm.Ended || time.Now().After(deadline) {
			break
		}
	}
	if after := time.Now(); j.EndTime.Before(before) || j.EndTime.After(after) {
		t.Errorf("job %s (%s) ended at %v by Slurm's word, want between %v and %v", id, j.State, j.EndTime, before, after)
	}
}

// TestDiscoveryFindsBothNodes: discovery reads each node of the
// partition from the real cluster with its own GPU type and count.
func TestDiscoveryFindsBothNodes(t *testing.T) {
	c := slurmtest.Shared(t)
	cl := client(c)
	ctx := context.Background()
	name, err := cl.ClusterName(ctx)
	if err != nil || name != slurmtest.ClusterName {
		t.Fatalf("ClusterName = %q, %v", name, err)
	}
	nodes, err := cl.Nodes(ctx, []string{slurmtest.Partition})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range nodes {
		got = append(got, n.Name+" "+n.Gres()+" "+strings.Join(n.Features, ",")+" "+n.Unavailable())
		if n.CPUs != 4 || n.MemoryMB != 1000 {
			t.Errorf("%s: %d CPUs, %d MB; want 4, 1000", n.Name, n.CPUs, n.MemoryMB)
		}
	}
	want := []string{"n1 gpu:a100:4 a100 ", "n2 gpu:h100:2 h100 "}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("nodes (-want +got):\n%s", d)
	}
	if none, err := cl.Nodes(ctx, []string{"nosuch"}); err != nil || len(none) != 0 {
		t.Errorf("partition nosuch: %v, %v", none, err)
	}
}

// TestDrainTakesTheNodeOutWithSlurmsReason: an admin's drain is seen at
// the next discovery, with the admin's reason; resume brings it back.
func TestDrainTakesTheNodeOutWithSlurmsReason(t *testing.T) {
	c := slurmtest.Shared(t)
	cl := client(c)
	c.Command(t, "scontrol", "update", "nodename=n2", "state=drain", "reason=gpu 1 xid 79")
	t.Cleanup(func() { c.Command(t, "scontrol", "update", "nodename=n2", "state=resume") })
	nodes, err := cl.Nodes(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		u := n.Unavailable()
		switch n.Name {
		case "n1":
			if u != "" {
				t.Errorf("n1 unavailable: %s", u)
			}
		case "n2":
			if !strings.HasPrefix(u, "slurm node n2 is drain") || !strings.Contains(u, "gpu 1 xid 79") {
				t.Errorf("n2: Unavailable() = %q, want drain with the admin's reason", u)
			}
		}
	}
}

type result struct {
	res     executor.Result
	events  []events.Event
	metrics []events.Metric
}

func (r result) lines(comp string) []string {
	var out []string
	for _, e := range r.events {
		if e.Component == comp {
			out = append(out, e.Message)
		}
	}
	return out
}

func (r result) has(sub string) bool {
	for _, e := range r.events {
		if strings.Contains(e.Message, sub) {
			return true
		}
	}
	return false
}

func runner(c *slurmtest.Cluster, node string) *slurm.Runner {
	gres := map[string]string{"n1": "gpu:a100:4", "n2": "gpu:h100:2"}[node]
	return &slurm.Runner{Client: client(c), Node: node, Gres: gres, Partition: slurmtest.Partition, Poll: 50 * time.Millisecond}
}

func workRoot(t *testing.T, c *slurmtest.Cluster) string {
	d, err := os.MkdirTemp(c.Shared, "work-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func execute(t *testing.T, ctx context.Context, x *executor.Executor, job executor.Job) result {
	t.Helper()
	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	res, err := x.Execute(ctx, job, sp)
	if err != nil {
		t.Fatal(err)
	}
	return readSpool(t, sp, res)
}

func readSpool(t *testing.T, sp *spool.Spool, res executor.Result) result {
	out := result{res: res}
	recs, err := sp.Pending(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		switch r.Kind {
		case spool.KindEvent:
			e, err := executor.DecodeEvent(r)
			if err != nil {
				t.Fatal(err)
			}
			out.events = append(out.events, e)
		case spool.KindMetric:
			m, err := executor.DecodeMetric(r)
			if err != nil {
				t.Fatal(err)
			}
			out.metrics = append(out.metrics, m)
		}
	}
	return out
}

// TestRunGoesThroughSbatch: an attempt is a batch job on the node it was
// placed on, with the GRES, job name and GPUPASS_* environment of the
// run; its stdout, stderr and metrics file all reach the spool, in order.
func TestRunGoesThroughSbatch(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	x := &executor.Executor{Runner: runner(c, "n2"), Host: &local.Host{}, MetricsPoll: 50 * time.Millisecond}
	job := executor.Job{AllocID: "alloc-sbatch1", Region: "hpc-1", WorkRoot: workRoot(t, c), MaxRestarts: 0,
		Command: []string{"sh", "-c", `for i in 1 2 3; do echo "out $i"; done; echo err1 >&2
echo "{\"step\":1,\"loss\":0.5}" >> "$GPUPASS_METRICS_FILE"
echo "$GPUPASS_ALLOC_ID $GPUPASS_REGION $SLURMD_NODENAME $SLURM_JOB_NAME gpus=$SLURM_GPUS_ON_NODE cwd=$(pwd)"
printf 'no newline at the end'`}}
	r := execute(t, context.Background(), x, job)
	if r.res.State != executor.Succeeded {
		t.Fatalf("run %s: %s", r.res.State, r.res.Reason)
	}
	wd := filepath.Join(job.WorkRoot, job.AllocID)
	want := []string{"out 1", "out 2", "out 3", "alloc-sbatch1 hpc-1 n2 gpupass-alloc-sbatch1 gpus=2 cwd=" + wd, "no newline at the end"}
	if d := cmp.Diff(want, r.lines(events.StdoutComponent)); d != "" {
		t.Errorf("stdout (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"err1"}, r.lines(events.StderrComponent)); d != "" {
		t.Errorf("stderr (-want +got):\n%s", d)
	}
	if len(r.metrics) != 1 || r.metrics[0].Step != 1 {
		t.Errorf("metrics: %+v", r.metrics)
	}
}

// TestFailedJobCarriesSlurmsStateAndExitCode.
func TestFailedJobCarriesSlurmsStateAndExitCode(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	x := &executor.Executor{Runner: runner(c, "n1"), Host: &local.Host{}}
	r := execute(t, context.Background(), x, executor.Job{AllocID: "alloc-fail1", WorkRoot: workRoot(t, c), Command: []string{"sh", "-c", "echo bye; exit 3"}})
	if r.res.State != executor.Failed || r.res.ExitCode != 3 || !strings.Contains(r.res.Reason, "FAILED (NonZeroExitCode, exit code 3)") || !strings.Contains(r.res.Reason, "on n1 (partition gpu)") {
		t.Fatalf("result %+v, want failed with Slurm's FAILED and exit code 3", r.res)
	}
}

// TestCancelStopsTheJobWithSIGTERM: cancelling the run scancels the job
// with SIGTERM first; the job's own handler runs and its last words are
// in the log.
func TestCancelStopsTheJobWithSIGTERM(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	rn := runner(c, "n1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var jobID string
	rn.OnJob = func(j slurm.Job) {
		jobID = j.ID
		if j.State == "RUNNING" {
			time.AfterFunc(500*time.Millisecond, cancel)
		}
	}
	x := &executor.Executor{Runner: rn, Host: &local.Host{}}
	r := execute(t, ctx, x, executor.Job{AllocID: "alloc-cancel1", WorkRoot: workRoot(t, c), Grace: 5 * time.Second,
		Command: []string{"sh", "-c", `trap 'echo got TERM; exit 0' TERM; echo started; while :; do sleep 0.1; done`}})
	if r.res.State != executor.Cancelled {
		t.Fatalf("run %s: %s", r.res.State, r.res.Reason)
	}
	if !r.has("got TERM") {
		t.Errorf("the job's TERM handler did not run; stdout: %q", r.lines(events.StdoutComponent))
	}
	j, err := client(c).Job(context.Background(), jobID)
	if err != nil || j.Phase() != slurm.Ended {
		t.Errorf("job %s after cancel: %+v, %v", jobID, j, err)
	}
}

// TestCancelKillsAJobThatIgnoresSIGTERM after the grace period.
func TestCancelKillsAJobThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	rn := runner(c, "n2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rn.OnJob = func(j slurm.Job) {
		if j.State == "RUNNING" {
			time.AfterFunc(300*time.Millisecond, cancel)
		}
	}
	x := &executor.Executor{Runner: rn, Host: &local.Host{}}
	r := execute(t, ctx, x, executor.Job{AllocID: "alloc-cancel2", WorkRoot: workRoot(t, c), Grace: time.Second,
		Command: []string{"sh", "-c", `trap 'echo ignoring TERM' TERM; while :; do sleep 0.1; done`}})
	if r.res.State != executor.Cancelled {
		t.Fatalf("run %s: %s", r.res.State, r.res.Reason)
	}
	if !r.has("SIGKILL after the grace period") {
		t.Errorf("no SIGKILL after the grace period in the log: %v", r.events)
	}
}

// TestTimeLimitEndsFailedWithTIMEOUT: the run's own limit (Job.TimeLimit)
// becomes sbatch --time over the agent's --slurm-time-limit, rounded up
// to Slurm's whole minutes (the run's log says so), and Slurm, not the
// executor, ends the job: failed with Slurm's TIMEOUT. Slurm counts
// limits in whole minutes, so this test takes one (it runs in parallel
// with the rest).
func TestTimeLimitEndsFailedWithTIMEOUT(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	rn := runner(c, "n1")
	rn.TimeLimit = time.Hour // the agent's default: the run's own limit wins
	x := &executor.Executor{Runner: rn, Host: &local.Host{}}
	r := execute(t, context.Background(), x, executor.Job{AllocID: "alloc-timeout1", WorkRoot: workRoot(t, c), TimeLimit: 2 * time.Second,
		Command: []string{"sh", "-c", "echo start; exec sleep 600"}})
	if r.res.State != executor.Failed || !strings.Contains(r.res.Reason, ": TIMEOUT (TimeLimit, time limit 00:01:00)") {
		t.Fatalf("result %+v, want failed with Slurm's TIMEOUT of a 1-minute limit", r.res)
	}
	if !r.has("sbatch --time=1: the run's time limit (2s left) rounded up to 1 minute(s), as Slurm counts whole minutes") {
		t.Errorf("the log does not say the limit was rounded up: %v", r.events)
	}
}

// TestNaNRestartIsANewJob: the NaN guard stops the job that logged a NaN
// loss (scancel) and starts the next attempt as a new batch job, from the
// newest checkpoint.
func TestNaNRestartIsANewJob(t *testing.T) {
	t.Parallel()
	c := slurmtest.Shared(t)
	x := &executor.Executor{Runner: runner(c, "n2"), Host: &local.Host{}, MetricsPoll: 50 * time.Millisecond}
	job := executor.Job{AllocID: "alloc-nan1", WorkRoot: workRoot(t, c), MaxRestarts: 2, Grace: 2 * time.Second,
		Command: []string{"sh", "-c", `echo "attempt $GPUPASS_ATTEMPT job $SLURM_JOB_ID resume=$GPUPASS_RESUME_FROM"
if [ "$GPUPASS_ATTEMPT" = 1 ]; then
  touch "$GPUPASS_CHECKPOINT_DIR/step-1.ckpt"
  echo '{"step":2,"loss":NaN}' >> "$GPUPASS_METRICS_FILE"
  while :; do sleep 0.1; done
fi
echo '{"step":2,"loss":0.25}' >> "$GPUPASS_METRICS_FILE"`}}
	r := execute(t, context.Background(), x, job)
	if r.res.State != executor.Succeeded || r.res.Restarts != 1 {
		t.Fatalf("result %+v, want succeeded after 1 restart", r.res)
	}
	out := r.lines(events.StdoutComponent)
	if len(out) != 2 || !strings.HasPrefix(out[0], "attempt 1 job ") || !strings.HasPrefix(out[1], "attempt 2 job ") ||
		!strings.HasSuffix(out[1], "step-1.ckpt") || strings.Fields(out[0])[3] == strings.Fields(out[1])[3] {
		t.Errorf("stdout %q: want two attempts as two jobs, the second resuming from step-1.ckpt", out)
	}
}

// TestAttemptEndCancelsWhatItsJobStarted: a job the attempt's job
// sbatch-es (a job of the same account) is cancelled when the attempt's
// job ends, and the run's log says so. Not parallel: the ledger's sweep
// cancels every job of the account it does not hold, the jobs of the
// package's parallel tests too, which run only after this one.
func TestAttemptEndCancelsWhatItsJobStarted(t *testing.T) {
	c := slurmtest.Shared(t)
	r := runner(c, "n1")
	r.Ledger = &slurm.Ledger{Dir: t.TempDir()}
	x := &executor.Executor{Runner: r, Host: &local.Host{}, MetricsPoll: 50 * time.Millisecond}
	job := executor.Job{AllocID: "alloc-stray1", Region: "hpc-1", WorkRoot: workRoot(t, c),
		Command: []string{"sh", "-c", fmt.Sprintf(`export SLURM_CONF=%s
id=$(sbatch --parsable --job-name stray-unit --output /dev/null --wrap "sleep 300") || exit 3
i=0; until [ "$(squeue -h -j $id -o %%T)" = RUNNING ]; do i=$((i+1)); [ $i -gt 200 ] && exit 4; sleep 0.1; done
echo "stray $id running"`, c.Conf)}}
	res := execute(t, context.Background(), x, job)
	if res.res.State != executor.Succeeded || !res.has("stray ") {
		t.Fatalf("run %s (%s), events %v", res.res.State, res.res.Reason, res.lines(events.StdoutComponent))
	}
	stray := c.Command(t, "squeue", "-h", "-t", "all", "-n", "stray-unit", "-o", "%i %T")
	if !regexp.MustCompile(`^[0-9]+ (CANCELLED|FAILED)\n$`).MatchString(stray) {
		t.Errorf("the job the attempt's job started, once the attempt ended: %q, want it ended", stray)
	}
	if !res.has("cancelled 1 slurm job(s) of the agent's account that no live run submitted (at the end of the attempt's job): job ") {
		t.Errorf("the run's log does not name the stray it cancelled")
	}
}
