package executor_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil"
)

func TestTerminalResults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		command   []string
		state     executor.State
		reason    string
		exitCode  int
		startLine string
	}{
		{"success", []string{"true"}, executor.Succeeded, "exited with status 0", 0, ""},
		{"non-zero exit", []string{"sh", "-c", "echo bye; exit 3"}, executor.Failed, "exited with status 3", 3, ""},
		{"killed by a signal", []string{"sh", "-c", "kill -KILL $$"}, executor.Failed, "killed by signal killed", -1, ""},
		{"command does not exist", []string{"gpupass-no-such-command-xyz"}, executor.Failed,
			`starting the command: exec: "gpupass-no-such-command-xyz": executable file not found in $PATH`, -1, "could not start"},
		{"not executable", []string{"/tmp"}, executor.Failed, "starting the command: fork/exec /tmp: permission denied", -1, "could not start"},
		{"empty command", nil, executor.Failed, "runtime-init: the run has no command", -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := execute(t, context.Background(), executor.Job{Command: tt.command}, nil)
			got := out.res
			if got.State != tt.state || got.Reason != tt.reason || got.ExitCode != tt.exitCode {
				t.Errorf("result = %s / %q / %d, want %s / %q / %d", got.State, got.Reason, got.ExitCode, tt.state, tt.reason, tt.exitCode)
			}
			last := out.events[len(out.events)-1]
			if last.Component != events.ExecutorComp || !strings.Contains(last.Message, tt.reason) || last.Fields["state"] != string(tt.state) {
				t.Errorf("last event %+v does not carry the terminal result", last)
			}
			if tt.startLine != "" {
				found := false
				for _, e := range out.find(events.ExecutorComp) {
					found = found || (e.Level == events.Error && strings.Contains(e.Message, tt.startLine))
				}
				if !found {
					t.Errorf("no ERROR executor event saying %q", tt.startLine)
				}
			}
		})
	}
}

func TestOutputBecomesEvents(t *testing.T) {
	t.Parallel()
	script := writeScript(t, `
echo "dataloader: 4096 samples"
echo "plain stdout"
echo "something odd" >&2
echo "trainer: warming up" >&2
printf 'bad \377 bytes\n'
echo 'gpupass:metric {"step":1,"loss":0.5,"acc":0.25}'
echo '{"step":2,"loss":0.4,"lr":0.1}' >> "$GPUPASS_METRICS_FILE"
echo 'not json' >> "$GPUPASS_METRICS_FILE"
echo 'Traceback (most recent call last):' >&2
echo '  File "x.py", line 1' >&2
echo 'ValueError: boom' >&2
exit 0
`)
	out := execute(t, context.Background(), executor.Job{Command: []string{script}}, nil)
	if out.res.State != executor.Succeeded {
		t.Fatalf("result %+v", out.res)
	}
	type ev struct {
		Level     events.Level
		Component string
		Message   string
		Fields    map[string]string
	}
	var got []ev
	for _, e := range out.events {
		if e.Component == events.ExecutorComp || e.Component == events.RuntimeInit {
			continue
		}
		got = append(got, ev{e.Level, e.Component, e.Message, e.Fields})
	}
	// stdout and stderr are read concurrently: compare per stream.
	byStream := func(evs []ev, stderr bool) []ev {
		var out []ev
		for _, e := range evs {
			if (e.Fields["stream"] == "stderr" || e.Component == "stderr") == stderr {
				out = append(out, e)
			}
		}
		return out
	}
	wantOut := []ev{
		{events.Info, "dataloader", "4096 samples", nil},
		{events.Info, "stdout", "plain stdout", nil},
		{events.Info, "stdout", "bad \uFFFD bytes", map[string]string{"invalid_utf8": "true"}},
		{events.Debug, "metrics", `gpupass:metric {"step":1,"loss":0.5,"acc":0.25}`, nil},
	}
	wantErr := []ev{
		{events.Warn, "stderr", "something odd", nil},
		{events.Warn, "trainer", "warming up", map[string]string{"stream": "stderr"}},
		{events.Error, "stderr", "Traceback (most recent call last):", nil},
		{events.Error, "stderr", `  File "x.py", line 1`, nil},
		{events.Error, "stderr", "ValueError: boom", nil},
	}
	nonMetricsFile := func(evs []ev) []ev {
		var out []ev
		for _, e := range evs {
			if !strings.HasPrefix(e.Message, executor.EnvMetricsFile) {
				out = append(out, e)
			}
		}
		return out
	}
	if d := cmp.Diff(wantOut, nonMetricsFile(byStream(got, false))); d != "" {
		t.Errorf("stdout events (-want +got):\n%s", d)
	}
	if d := cmp.Diff(wantErr, byStream(got, true)); d != "" {
		t.Errorf("stderr events (-want +got):\n%s", d)
	}
	var warned bool
	for _, e := range out.find(events.MetricsComp) {
		warned = warned || (e.Level == events.Warn && strings.Contains(e.Message, "GPUPASS_METRICS_FILE line 2: not a JSON object"))
	}
	if !warned {
		t.Error("no WARN event for the malformed metrics file line")
	}
	type pt struct {
		Step    int64
		Attempt int
		Source  string
		Values  map[string]float64
	}
	var pts []pt
	for _, m := range out.metrics {
		pts = append(pts, pt{m.Step, m.Attempt, m.Source, m.Values})
		if m.Time.IsZero() || m.Time.Location() != time.UTC {
			t.Errorf("metric time %v is not UTC", m.Time)
		}
	}
	wantPts := []pt{{1, 1, "stdout", map[string]float64{"loss": 0.5, "acc": 0.25}}, {2, 1, "file", map[string]float64{"loss": 0.4, "lr": 0.1}}}
	if d := cmp.Diff(wantPts, pts, cmpopts.SortSlices(func(a, b pt) bool { return a.Step < b.Step })); d != "" {
		t.Errorf("metric points (-want +got):\n%s", d)
	}
	for _, e := range out.events {
		if e.Time.Location() != time.UTC || e.Time.Nanosecond()%int(time.Millisecond) != 0 {
			t.Errorf("event time %v is not UTC milliseconds", e.Time)
		}
	}
}

func TestEnvironment(t *testing.T) {
	t.Parallel()
	sp := &spec.Spec{Runtime: spec.Runtime{CUDAMallocAsync: true, CUDAMallocAsyncReleaseThreshold: "2GB"}}
	job := executor.Job{
		AllocID:      "alloc-8a3f9b21",
		Region:       "eu-central-1",
		Command:      []string{"env"},
		Spec:         sp,
		CUDAHome:     "/usr/local/cuda-12.1",
		LibraryPaths: []string{"/opt/nccl/lib"},
		BaseEnv: []string{"PATH=" + os.Getenv("PATH"), "LD_LIBRARY_PATH=/usr/lib/old", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
			"GPUPASS_RESUME_FROM=/stale", "KEEP=me"},
	}
	out := execute(t, context.Background(), job, nil)
	got := map[string]string{}
	for _, e := range out.find("stdout") {
		if k, v, ok := strings.Cut(e.Message, "="); ok {
			got[k] = v
		}
	}
	wd := out.res.WorkDir
	want := map[string]string{
		"CUDA_HOME":                  "/usr/local/cuda-12.1",
		"LD_LIBRARY_PATH":            "/usr/local/cuda-12.1/lib64:/opt/nccl/lib:/usr/lib/old",
		"PYTORCH_CUDA_ALLOC_CONF":    "backend:cudaMallocAsync",
		executor.EnvReleaseThreshold: "2000000000",
		executor.EnvAllocID:          "alloc-8a3f9b21",
		executor.EnvRegion:           "eu-central-1",
		executor.EnvMetricsFile:      filepath.Join(wd, "metrics.jsonl"),
		executor.EnvCheckpointDir:    filepath.Join(wd, "checkpoints"),
		executor.EnvAttempt:          "1",
		"KEEP":                       "me",
		"PWD":                        wd,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got[executor.EnvResumeFrom]; ok {
		t.Errorf("a first attempt must not inherit %s", executor.EnvResumeFrom)
	}
	if filepath.Base(wd) != "alloc-8a3f9b21" {
		t.Errorf("work dir %s is not per run", wd)
	}

	bad := executor.Job{Command: []string{"true"}, Spec: &spec.Spec{Runtime: spec.Runtime{CUDAMallocAsyncReleaseThreshold: "lots"}}}
	res := execute(t, context.Background(), bad, nil).res
	if res.State != executor.Failed || !strings.Contains(res.Reason, "runtime.cuda-malloc-async-release-threshold") {
		t.Errorf("bad threshold: %+v", res)
	}
}

// TestEnvironmentHidesAgentSecrets: the agent reads its token and
// registry password from GPUPASS_* variables (and their _FILE forms); a
// job that prints its environment must find none of them, or every
// line would go up to the broker as an event. The GPUPASS_* variables
// the executor sets for the job still reach it. Not parallel: it sets
// the process environment the executor starts from.
func TestEnvironmentHidesAgentSecrets(t *testing.T) {
	const secret = "gpa_supersecret"
	agentVars := []string{"GPUPASS_BROKER_TOKEN", "GPUPASS_BROKER_TOKEN_FILE", "GPUPASS_TOKEN", "GPUPASS_TOKEN_FILE", "GPUPASS_REGISTRY_PASSWORD", "GPUPASS_REGISTRY_PASSWORD_FILE", "GPUPASS_BROKER_URL"}
	for _, k := range agentVars {
		t.Setenv(k, secret+"-"+k)
	}
	t.Setenv("KEEP_ME", "yes")
	for _, tc := range []struct {
		name string
		base []string
	}{
		{"the agent's own environment", nil},
		{"a base environment that carries them", os.Environ()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := executor.Job{AllocID: "alloc-envsecret", Region: "us-west-2", BaseEnv: tc.base,
				Command: []string{"sh", "-c", `echo "t=$GPUPASS_TOKEN"; env`}}
			out := execute(t, context.Background(), job, nil)
			if out.res.State != executor.Succeeded {
				t.Fatalf("run %s: %s", out.res.State, out.res.Reason)
			}
			got := map[string]string{}
			for _, e := range out.events {
				if strings.Contains(e.Message, secret) {
					t.Errorf("an event of component %s carries the agent's secret: %q", e.Component, e.Message)
				}
				if e.Component == "stdout" {
					if k, v, ok := strings.Cut(e.Message, "="); ok {
						got[k] = v
					}
				}
			}
			for _, k := range agentVars {
				if _, ok := got[k]; ok {
					t.Errorf("the job inherited %s", k)
				}
			}
			for _, k := range []string{executor.EnvAllocID, executor.EnvRegion, executor.EnvMetricsFile, executor.EnvCheckpointDir, executor.EnvAttempt, "KEEP_ME"} {
				if got[k] == "" {
					t.Errorf("the job has no %s", k)
				}
			}
		})
	}
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.PIDAlive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("process %d was left behind", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCancelKillsTheGroup: a job that ignores SIGTERM and has a
// grandchild is cancelled; SIGKILL follows the grace period and nothing
// is left running.
func TestCancelKillsTheGroup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "grandchild.pid")
	script := writeScript(t, `
trap 'echo "got TERM, ignoring" >&2' TERM
sh -c 'trap "" TERM; echo $$ > `+pidFile+`; exec sleep 300' &
echo ready
while :; do sleep 1; done
`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan runOut, 1)
	go func() {
		done <- execute(t, ctx, executor.Job{Command: []string{script}, Grace: 300 * time.Millisecond}, nil)
	}()
	gc := readPid(t, pidFile)
	if !testutil.PIDAlive(gc) {
		t.Fatal("grandchild did not start")
	}
	cancel()
	out := <-done
	if out.res.State != executor.Cancelled || out.res.Reason != "cancelled" {
		t.Errorf("result %+v, want cancelled", out.res)
	}
	waitGone(t, gc)
	var stopped bool
	for _, e := range out.find(events.ExecutorComp) {
		stopped = stopped || strings.Contains(e.Message, "SIGKILL after the grace period")
	}
	if !stopped {
		t.Errorf("no event says SIGKILL followed the grace period: %+v", out.find(events.ExecutorComp))
	}
}

// TestLeftoversAreKilled: a job that exits leaving a background process
// in its group does not leave it running.
func TestLeftoversAreKilled(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "bg.pid")
	script := writeScript(t, `sh -c 'echo $$ > `+pidFile+`; exec sleep 300' >/dev/null 2>&1 &
while [ ! -s `+pidFile+` ]; do sleep 0.01; done
exit 0
`)
	out := execute(t, context.Background(), executor.Job{Command: []string{script}}, nil)
	if out.res.State != executor.Succeeded {
		t.Fatalf("result %+v", out.res)
	}
	waitGone(t, readPid(t, pidFile))
}

// TestFlood: 100 MB of output, as one huge line and as many lines, ends
// cleanly with bounded lines.
func TestFlood(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("100 MB flood in -short mode")
	}
	t.Run("one 100 MB line", func(t *testing.T) {
		t.Parallel()
		out := execute(t, context.Background(), executor.Job{Command: []string{"sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo after"}},
			&executor.Executor{MaxLine: 1024})
		lines := out.find("stdout")
		if out.res.State != executor.Succeeded || len(lines) != 2 {
			t.Fatalf("result %+v, %d stdout events", out.res, len(lines))
		}
		if lines[0].Fields["cut_bytes"] != strconv.Itoa(100000000-1024) || !strings.Contains(lines[0].Message, "line cut") || lines[1].Message != "after" {
			t.Errorf("cut line: fields %v, message tail %q; next %q", lines[0].Fields, lines[0].Message[1024:], lines[1].Message)
		}
	})
	t.Run("many lines", func(t *testing.T) {
		t.Parallel()
		// 100 MB of 10,000-byte lines: 10,000 events.
		out := executeOpt(t, context.Background(), executor.Job{Command: []string{"sh", "-c", "head -c 99990000 /dev/zero | tr '\\0' y | fold -w 9999"}}, nil, false)
		if n := out.stdoutRecords; out.res.State != executor.Succeeded || n != 10000 {
			t.Fatalf("result %+v, %d stdout events, want 10000", out.res, n)
		}
	})
}

func TestCancelBeforeStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("user asked"))
	out := execute(t, ctx, executor.Job{Command: []string{"sleep", "30"}}, nil)
	if out.res.State != executor.Cancelled || out.res.Reason != "cancelled: user asked" {
		t.Errorf("result %+v", out.res)
	}
}

// failingSpool fails every append after the first n records.
type failingSpool struct {
	n    int
	seen int
}

func (f *failingSpool) Append(recs ...spool.Record) (uint64, uint64, error) {
	if f.seen+len(recs) > f.n {
		return 0, 0, fmt.Errorf("appending to spool /x: %w", syscall.ENOSPC)
	}
	first := uint64(f.seen + 1)
	f.seen += len(recs)
	return first, uint64(f.seen), nil
}

func TestSpoolFailureFailsTheRun(t *testing.T) {
	t.Parallel()
	x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
	res, err := x.Execute(context.Background(), executor.Job{AllocID: "alloc-1", WorkRoot: t.TempDir(), Command: []string{"sh", "-c", "while :; do echo spam; done"}, Grace: time.Second}, &failingSpool{n: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != executor.Failed || !strings.Contains(res.Reason, "no space left on device") {
		t.Errorf("result %+v", res)
	}
}

func TestBadAllocID(t *testing.T) {
	t.Parallel()
	x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
	for _, id := range []string{"", "..", "a/b"} {
		if _, err := x.Execute(context.Background(), executor.Job{AllocID: id, WorkRoot: t.TempDir(), Command: []string{"true"}}, &failingSpool{n: 100}); err == nil {
			t.Errorf("alloc id %q accepted", id)
		}
	}
}

// TestExecutorWithoutHostRefuses: an Executor built without a Host (a
// backend that forgot it) refuses the run, naming the field, and starts
// nothing: without a hold, what a run starts outlives it and the next run
// shares its /tmp, with nothing to say so.
func TestExecutorWithoutHostRefuses(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	ran := filepath.Join(root, "ran")
	x := &executor.Executor{Runner: local.ProcessRunner{}}
	_, err := x.Execute(context.Background(), executor.Job{AllocID: "alloc-nohost", WorkRoot: root, Command: []string{"touch", ran}}, &failingSpool{n: 100})
	if !errors.Is(err, executor.ErrNoHost) || !strings.Contains(err.Error(), "Executor.Host") {
		t.Fatalf("Execute without a Host = %v, want a refusal naming Executor.Host", err)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the job ran without a Host")
	}
}

var _ = math.NaN

// TestSameWorkDirAgain: executing a run again in its work dir (after an
// agent restart) spools only the new metric points.
func TestSameWorkDirAgain(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	job := executor.Job{AllocID: "alloc-again", WorkRoot: root, Command: []string{"sh", "-c", `echo '{"step":'$(( $(wc -l < "$GPUPASS_METRICS_FILE") + 1 ))',"loss":1}' >> "$GPUPASS_METRICS_FILE"`}}
	first := execute(t, context.Background(), job, nil)
	second := execute(t, context.Background(), job, nil)
	if len(first.metrics) != 1 || len(second.metrics) != 1 || first.metrics[0].Step != 1 || second.metrics[0].Step != 2 {
		t.Errorf("first run points %+v, second %+v; want step 1 then only step 2", first.metrics, second.metrics)
	}
}
