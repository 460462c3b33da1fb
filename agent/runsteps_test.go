package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/spec"
)

// newTestRun is a run of the loop's work source as RunAssignment makes it.
func newTestRun(t *testing.T, a *Assignment) (*run, *memSource) {
	t.Helper()
	src := newMemSource()
	l := newTestLoop(src, t.TempDir())
	r := &run{l: l, a: a, log: l.log(), ledgerWritten: func() error { return nil }}
	r.final = AllocUpdate{AllocID: a.AllocID, FencingToken: a.FencingToken}
	return r, src
}

// TestPrepareWorkdir: the work dir starts afresh (nothing of an earlier
// placement stays), holds the job's files and the checkpoint it resumes
// from.
func TestPrepareWorkdir(t *testing.T) {
	t.Parallel()
	r, _ := newTestRun(t, &Assignment{
		AllocID: "alloc-w", Workdir: tarball(t, map[string]string{"train.py": "print(1)\n"}),
		ResumeCheckpointName: "step-10.pt", ResumeCheckpoint: []byte("weights"),
	})
	earlier := filepath.Join(r.l.StateDir, "runs", "alloc-w", "left-by-earlier-placement")
	if err := os.MkdirAll(filepath.Dir(earlier), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(earlier, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.prepareWorkdir(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(earlier); !os.IsNotExist(err) {
		t.Errorf("a file of an earlier placement stayed: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(r.workDir, "train.py")); err != nil || string(b) != "print(1)\n" {
		t.Errorf("job file: %q, %v", b, err)
	}
	if b, err := os.ReadFile(r.resumeFrom); err != nil || string(b) != "weights" {
		t.Errorf("resume checkpoint %s: %q, %v", r.resumeFrom, b, err)
	}
	bad, _ := newTestRun(t, &Assignment{AllocID: "alloc-b", ResumeCheckpointName: "../escape", ResumeCheckpoint: []byte("x")})
	if err := bad.prepareWorkdir(); err == nil {
		t.Error("a checkpoint name leaving the work dir was placed")
	}
}

// TestRunExecutorChecks: runtime-init runs the node's checks, the
// conformance check against the spec, and the lease edge last, which
// alone marks the run running.
func TestRunExecutorChecks(t *testing.T) {
	t.Parallel()
	r, src := newTestRun(t, &Assignment{AllocID: "alloc-c", FencingToken: 7})
	r.l.Executor.Checks = []executor.RuntimeCheck{{Name: "node-own"}}
	r.l.Recheck = func(context.Context, *spec.Spec) ([]conformance.Check, error) { return nil, nil }
	r.spec = &spec.Spec{}
	r.state.Store(StateStarting)
	x := r.executor()
	var names []string
	for _, c := range x.Checks {
		names = append(names, c.Name)
	}
	if len(names) != 3 || names[0] != "node-own" || names[1] != "conformance" || names[2] != "lease" {
		t.Fatalf("checks %v, want node-own, conformance, lease", names)
	}
	if len(r.l.Executor.Checks) != 1 {
		t.Errorf("the loop's own executor gained checks: %d", len(r.l.Executor.Checks))
	}
	if r.state.Load() != StateStarting {
		t.Error("running before the lease check")
	}
	if _, err := x.Checks[2].Run(context.Background(), executor.Job{}); err != nil {
		t.Fatal(err)
	}
	if r.state.Load() != StateRunning {
		t.Error("the lease check did not mark the run running")
	}
	if got := src.states(); len(got) != 1 || got[0] != StateRunning {
		t.Errorf("edges sent %v, want [running]", got)
	}
}

// TestRunWatch: the watcher stops the run when the broker refuses the
// lease (and marks it stale) or asks for a cancel, naming the cause.
func TestRunWatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		stale     bool
		cancel    bool
		wantCause string
	}{
		{"lease lost", true, false, ErrStaleLease.Error()},
		{"cancel requested", false, true, "cancelled by the broker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, src := newTestRun(t, &Assignment{AllocID: "alloc-x"})
			if tt.stale {
				src.staleAfter = 1
			}
			if tt.cancel {
				src.cancelAfter = 1
			}
			r.state.Store(StateRunning)
			ctx, stop := context.WithCancelCause(context.Background())
			defer stop(nil)
			r.watch(ctx, stop, nil) // returns once it stopped the run
			if got := context.Cause(ctx); got == nil || got.Error() != tt.wantCause {
				t.Errorf("cause %v, want %q", got, tt.wantCause)
			}
			if r.stale.Load() != tt.stale {
				t.Errorf("stale %t, want %t", r.stale.Load(), tt.stale)
			}
		})
	}
}

// TestRunSettle: the executor's outcome becomes the final update; an
// agent that stops is not a cancel by anyone.
func TestRunSettle(t *testing.T) {
	t.Parallel()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name       string
		ctx        context.Context
		res        executor.Result
		err        error
		wantState  AllocState
		wantReason string
		wantCode   int
	}{
		{"succeeded", context.Background(), executor.Result{State: "succeeded", Attempts: 2, Restarts: 1, LastSeq: 9}, nil, StateSucceeded, "", 0},
		{"exited 3", context.Background(), executor.Result{State: "failed", Reason: "exited with status 3", ExitCode: 3}, nil, StateFailed, "exited with status 3", 3},
		{"runtime-init failed", context.Background(), executor.Result{}, errors.New("package mismatch"), StateFailed, "package mismatch", -1},
		{"cancelled by the broker", context.Background(), executor.Result{State: "cancelled", Reason: "cancelled"}, nil, StateCancelled, "cancelled", 0},
		{"agent stopping", stopped, executor.Result{State: "cancelled", Reason: "cancelled"}, nil, StateFailed, "agent stopped during the run", 0},
	}
	for _, tt := range tests {
		r, _ := newTestRun(t, &Assignment{AllocID: "alloc-s"})
		r.settle(tt.ctx, tt.res, tt.err)
		if r.final.State != tt.wantState || r.final.Reason != tt.wantReason || r.final.ExitCode != tt.wantCode {
			t.Errorf("%s: final %+v, want %s %q exit %d", tt.name, r.final, tt.wantState, tt.wantReason, tt.wantCode)
		}
		if tt.err == nil && (r.final.Attempts != tt.res.Attempts || r.final.LastSeq != tt.res.LastSeq) {
			t.Errorf("%s: counts %+v not taken from %+v", tt.name, r.final, tt.res)
		}
	}
}

// TestRunFinish: the final state goes to the broker after every record,
// and a run whose lease was lost is dropped without a final state.
func TestRunFinish(t *testing.T) {
	t.Parallel()
	for _, stale := range []bool{false, true} {
		r, src := newTestRun(t, &Assignment{AllocID: "alloc-f", FencingToken: 3})
		if err := r.openSpool(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.spool.Append(spool.Record{Kind: 1, Data: []byte("a line")}); err != nil {
			t.Fatal(err)
		}
		r.final.State = StateSucceeded
		r.stale.Store(stale)
		got := r.finish(context.Background())
		r.closeSpool()
		n, atEnd := src.held()
		switch {
		case stale && (got.Reason != ErrStaleLease.Error() || len(src.states()) != 0 || !gone(r.l.StateDir, "alloc-f")):
			t.Errorf("stale: final %+v, edges %v, spool gone %t", got, src.states(), gone(r.l.StateDir, "alloc-f"))
		case !stale && (got.State != StateSucceeded || got.LastSeq != 1 || n != 1 || atEnd != 1):
			t.Errorf("final %+v, %d records held (%d at the end), want succeeded after 1", got, n, atEnd)
		}
	}
}
