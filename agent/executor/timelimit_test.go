package executor_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
)

// TestTimeLimitStopsTheRun: at the run's limit the local executor stops
// the job as a cancel does (SIGTERM to the group, SIGKILL of what is left
// after the grace period: a grandchild that ignores SIGTERM goes too) and
// the run ends failed with TIMEOUT and the limit.
func TestTimeLimitStopsTheRun(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	script := writeScript(t, `
trap 'echo "got TERM, ignoring" >&2' TERM
sh -c 'trap "" TERM; echo $$ > `+pidFile+`; exec sleep 300' &
echo ready
while :; do sleep 0.1; done
`)
	out := execute(t, context.Background(), executor.Job{Command: []string{script}, Grace: 300 * time.Millisecond, TimeLimit: time.Second}, nil)
	if out.res.State != executor.Failed || out.res.Reason != "TIMEOUT: time limit 1s reached" || out.res.Attempts != 1 {
		t.Fatalf("result %+v, want failed with TIMEOUT: time limit 1s reached", out.res)
	}
	waitGone(t, readPid(t, pidFile))
	var said bool
	for _, e := range out.find(events.ExecutorComp) {
		said = said || (e.Level == events.Error && strings.HasPrefix(e.Message, "TIMEOUT: time limit 1s reached") &&
			strings.Contains(e.Message, "SIGKILL after the grace period") && e.Fields["time_limit"] == "1s")
	}
	if !said {
		t.Errorf("no ERROR event says the run reached its limit and was killed: %+v", out.find(events.ExecutorComp))
	}
}

// TestTimeLimitIsTheRuns: NaN restarts share one wall-clock budget. Each
// attempt logs a NaN loss after a while, so with a limit per attempt the
// run would restart until --max-restarts and fail for the NaN; the run's
// limit ends it with TIMEOUT after a few attempts instead.
func TestTimeLimitIsTheRuns(t *testing.T) {
	t.Parallel()
	script := writeScript(t, `sleep 0.5; echo '{"step":1,"loss":NaN}' >> "$GPUPASS_METRICS_FILE"; sleep 30`)
	out := execute(t, context.Background(), executor.Job{Command: []string{script}, MaxRestarts: 50, Grace: time.Second, TimeLimit: 2 * time.Second},
		&executor.Executor{MetricsPoll: 10 * time.Millisecond})
	res := out.res
	if res.State != executor.Failed || !strings.HasPrefix(res.Reason, "TIMEOUT: time limit 2s reached") || res.Restarts < 1 || res.Restarts >= 50 {
		t.Fatalf("result %+v, want TIMEOUT after at least one NaN restart", res)
	}
}

// TestTimeLimitNotReached: a run that ends within its limit ends as it
// would without one, and its attempt's start says how much time is left.
func TestTimeLimitNotReached(t *testing.T) {
	t.Parallel()
	out := execute(t, context.Background(), executor.Job{Command: []string{"true"}, TimeLimit: time.Hour}, nil)
	if out.res.State != executor.Succeeded {
		t.Fatalf("result %+v", out.res)
	}
	var left string
	for _, e := range out.find(events.ExecutorComp) {
		if strings.HasPrefix(e.Message, "attempt 1: starting") {
			left = e.Fields["time_left"]
		}
	}
	if left != "1h0m0s" {
		t.Errorf("attempt 1's time_left = %q, want 1h0m0s", left)
	}
}

// schedRunner is a runner whose scheduler enforces the limit itself
// (executor.LimitEnforcer): it records each attempt's TimeLimit and ends
// each attempt after hold (or when stopped), in the scheduler's words.
type schedRunner struct {
	hold time.Duration
	mu   sync.Mutex
	got  []time.Duration
	from []bool
}

func (r *schedRunner) EnforcesTimeLimit() bool { return true }

func (r *schedRunner) Run(ctx context.Context, a executor.Attempt, _ func(executor.Line)) executor.Exit {
	r.mu.Lock()
	r.got, r.from = append(r.got, a.TimeLimit), append(r.from, a.From != nil)
	r.mu.Unlock()
	select {
	case <-ctx.Done():
		return executor.Exit{Code: -1, Stopped: true}
	case <-time.After(r.hold):
		return executor.Exit{Code: -1, Reason: "sched job 1: TIMEOUT"}
	}
}

// TestTimeLimitOfAScheduler: a LimitEnforcer gets what is left of the
// limit and is not stopped at the deadline by the executor (the
// scheduler's TIMEOUT, with its reason, ends the run); a run followed on
// after an agent restart keeps its original deadline, and is not started
// again once that has passed.
func TestTimeLimitOfAScheduler(t *testing.T) {
	t.Parallel()
	t.Run("the scheduler ends it", func(t *testing.T) {
		t.Parallel()
		rn := &schedRunner{hold: 1500 * time.Millisecond}
		out := execute(t, context.Background(), executor.Job{Command: []string{"train"}, TimeLimit: time.Second}, &executor.Executor{Runner: rn})
		if out.res.State != executor.Failed || out.res.Reason != "sched job 1: TIMEOUT" {
			t.Fatalf("result %+v, want the scheduler's TIMEOUT (the executor must not stop a LimitEnforcer)", out.res)
		}
		if len(rn.got) != 1 || rn.got[0] <= 0 || rn.got[0] > time.Second {
			t.Errorf("attempt time limits %v, want one of at most 1s", rn.got)
		}
	})
	t.Run("reattached keeps its deadline", func(t *testing.T) {
		t.Parallel()
		rn := &schedRunner{hold: 10 * time.Millisecond}
		mark := &executor.Mark{Attempt: 1, Deadline: time.Now().Add(30 * time.Second).UnixNano()}
		out := execute(t, context.Background(), executor.Job{Command: []string{"train"}, TimeLimit: time.Hour, Reattach: mark},
			&executor.Executor{Runner: rn, Marks: true})
		if out.res.State != executor.Failed || len(rn.got) != 1 || rn.got[0] > 30*time.Second || !rn.from[0] {
			t.Fatalf("result %+v, attempts' limits %v (followed on %v): want the one attempt followed on with at most the 30s its deadline leaves, not the hour",
				out.res, rn.got, rn.from)
		}
	})
	t.Run("no restart past the deadline", func(t *testing.T) {
		t.Parallel()
		// A NaN restart due after the deadline: the followed-on attempt
		// ends (NaN), and no new one starts.
		rn := &schedRunner{hold: 10 * time.Millisecond}
		mark := &executor.Mark{Attempt: 1, Deadline: time.Now().Add(-time.Second).UnixNano()}
		x := &executor.Executor{Runner: nanRunner{rn}, Marks: true, MetricsPoll: 10 * time.Millisecond}
		out := execute(t, context.Background(), executor.Job{Command: []string{"train"}, TimeLimit: time.Hour, MaxRestarts: 3, Reattach: mark}, x)
		if out.res.State != executor.Failed || out.res.Reason != "TIMEOUT: time limit 1h reached" || len(rn.got) != 1 {
			t.Fatalf("result %+v after %d attempt(s), want TIMEOUT without a second attempt", out.res, len(rn.got))
		}
	})
}

// nanRunner prints a NaN loss, then runs as its schedRunner does.
type nanRunner struct{ *schedRunner }

func (r nanRunner) Run(ctx context.Context, a executor.Attempt, out func(executor.Line)) executor.Exit {
	out(executor.Line{Stream: events.Stdout, Text: `gpupass:metric {"step":1,"loss":NaN}`})
	<-ctx.Done() // the NaN guard stops it
	r.schedRunner.Run(context.Background(), a, nil)
	return executor.Exit{Code: -1, Stopped: true}
}
