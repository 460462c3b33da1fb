package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
	"github.com/gpupass/gpupass/internal/api"
)

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (m *memSource) held() (n, atEnd int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.recs), m.heldAtEnd
}

func newTestLoop(src *memSource, dir string) *RunLoop {
	return &RunLoop{
		Source: src, AgentID: func() string { return "agent-1" },
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
		StateDir: dir, UpdateEvery: 20 * time.Millisecond, DrainTimeout: 300 * time.Millisecond, Retry: 20 * time.Millisecond,
	}
}

// gone reports whether the run's ledger and spool were removed.
func gone(dir, id string) bool {
	_, e1 := os.Stat(filepath.Join(dir, "spool", id+".json"))
	_, e2 := os.Stat(filepath.Join(dir, "spool", id))
	return errors.Is(e1, os.ErrNotExist) && errors.Is(e2, os.ErrNotExist)
}

// TestFinalStateWaitsForTheSpool: while the broker does not hold every
// record, no terminal state is reported; once it takes them (later, or
// after the agent restarted) the final state follows, with the whole log
// held, and the run's spool and ledger are gone.
func TestFinalStateWaitsForTheSpool(t *testing.T) {
	t.Parallel()
	const id = "alloc-0000f1a1"
	job := &Assignment{AllocID: id, FencingToken: 3, Command: []string{"sh", "-c", "for i in $(seq 1 500); do echo line $i; done"}}
	brokerAway := errors.New("broker unavailable")
	tests := []struct {
		name    string
		restart bool // the agent stops before the broker is back
	}{
		{name: "broker back while the agent runs"},
		{name: "broker back after the agent restarted", restart: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := newMemSource()
			src.setUploadErr(brokerAway)
			l := newTestLoop(src, dir)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a := *job
			final := l.RunAssignment(ctx, &a)
			if final.State != StateSucceeded {
				t.Fatalf("run ended %s (%s)", final.State, final.Reason)
			}
			time.Sleep(200 * time.Millisecond)
			if diff := cmp.Diff([]AllocState{StateStarting, StateRunning}, src.states()); diff != "" {
				t.Fatalf("states reported while the broker holds nothing (-want +got):\n%s", diff)
			}
			if _, err := os.Stat(filepath.Join(dir, "spool", id+".json")); err != nil {
				t.Fatalf("no ledger for the undelivered run: %v", err)
			}
			if tc.restart {
				cancel()
				l.WaitFinished()
				src.setUploadErr(nil)
				time.Sleep(100 * time.Millisecond)
				if got := src.states(); len(got) != 2 {
					t.Fatalf("a stopped agent reported %v", got)
				}
				l = newTestLoop(src, dir)
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				go func() { done <- l.Run(ctx) }()
				defer func() { cancel(); <-done }()
			} else {
				src.setUploadErr(nil)
			}
			waitUntil(t, "the final state", func() bool { return len(src.states()) == 3 })
			if diff := cmp.Diff([]AllocState{StateStarting, StateRunning, StateSucceeded}, src.states()); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
			n, atEnd := src.held()
			if atEnd != n || uint64(n) != final.LastSeq || n < 500 {
				t.Errorf("held %d records when the final state came, %d in all, last seq %d", atEnd, n, final.LastSeq)
			}
			if msgs := src.messages(t); !contains(msgs, "line 500") {
				t.Errorf("the last output line is not held")
			}
			waitUntil(t, "the spool and ledger to go", func() bool { return gone(dir, id) })
		})
	}
}

// TestRestartFinishesRunsFromBefore: an agent that died under a run (or
// whose lease moved on meanwhile) finds the run's ledger on start.
func TestRestartFinishesRunsFromBefore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		ledger     runLedger
		uploadErr  error
		wantStates []AllocState
		wantReason string
		wantHeld   int
	}{
		{
			name:       "agent killed mid-run: records sent, then failed",
			ledger:     runLedger{AllocID: "alloc-0000dead", FencingToken: 2},
			wantStates: []AllocState{StateFailed},
			wantReason: "agent restarted during the run",
			wantHeld:   3,
		},
		{
			name:       "run ended before the restart: records sent, then its own end",
			ledger:     runLedger{AllocID: "alloc-0000e0d0", FencingToken: 2, Final: &AllocUpdate{State: StateSucceeded, Reason: "exited with status 0", LastSeq: 3}},
			wantStates: []AllocState{StateSucceeded},
			wantReason: "exited with status 0",
			wantHeld:   3,
		},
		{
			name:      "lease moved to another node: nothing reported, spool dropped",
			ledger:    runLedger{AllocID: "alloc-0000a0a0", FencingToken: 2},
			uploadErr: fmt.Errorf("uploading: %w: %w", uploader.ErrRefused, ErrStaleLease),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			sp, err := spool.Open(filepath.Join(dir, "spool", tc.ledger.AllocID), spool.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if _, _, err := sp.Append(spool.Record{Kind: spool.KindEvent, Data: fmt.Appendf(nil, `{"level":"INFO","component":"stdout","message":"before %d"}`, i)}); err != nil {
					t.Fatal(err)
				}
			}
			sp.Close()
			src := newMemSource()
			src.setUploadErr(tc.uploadErr)
			l := newTestLoop(src, dir)
			if err := l.writeLedger(tc.ledger); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- l.Run(ctx) }()
			waitUntil(t, "the spool and ledger to go", func() bool { return gone(dir, tc.ledger.AllocID) })
			cancel()
			<-done
			if diff := cmp.Diff(tc.wantStates, src.states()); diff != "" {
				t.Fatalf("states (-want +got):\n%s", diff)
			}
			n, atEnd := src.held()
			if n != tc.wantHeld || (len(tc.wantStates) > 0 && atEnd != tc.wantHeld) {
				t.Errorf("held %d records (%d at the final state), want %d", n, atEnd, tc.wantHeld)
			}
			if len(tc.wantStates) > 0 {
				u := src.updates[len(src.updates)-1]
				if !strings.Contains(u.Reason, tc.wantReason) || u.LastSeq != 3 || u.FencingToken != 2 {
					t.Errorf("final update %+v, want reason %q, last seq 3, token 2", u, tc.wantReason)
				}
			}
		})
	}
}

// TestCheckpointsTravel: the newest checkpoint goes up with the run's
// records, and a run resumed with a shipped checkpoint starts from it.
func TestCheckpointsTravel(t *testing.T) {
	t.Parallel()
	src := newMemSource()
	l := newTestLoop(src, t.TempDir())
	l.DrainTimeout = 10 * time.Second
	big := strings.Repeat("w", api.CheckpointChunk+10) // two chunks
	job := `d="$GPUPASS_CHECKPOINT_DIR"; mkdir -p "$d"
echo step-1 > "$d/ckpt-1.pt"; sleep 0.8
head -c ` + strconv.Itoa(len(big)) + ` /dev/zero | tr '\0' w > "$d/ckpt-2.pt.tmp"; mv "$d/ckpt-2.pt.tmp" "$d/ckpt-2.pt"; sleep 1.2`
	a := &Assignment{AllocID: "alloc-0000c0c0", FencingToken: 1, Command: []string{"sh", "-c", job}}
	final := l.RunAssignment(context.Background(), a)
	if final.State != StateSucceeded {
		t.Fatalf("run ended %s (%s)", final.State, final.Reason)
	}
	var asm api.CheckpointAssembler
	src.mu.Lock()
	for seq := uint64(1); seq <= uint64(len(src.recs)); seq++ {
		if r := src.recs[seq]; r.Kind == spool.KindCheckpoint {
			if err := asm.Add(r.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	src.mu.Unlock()
	if name, data := asm.Newest(); name != "ckpt-2.pt" || string(data) != big {
		t.Fatalf("newest shipped checkpoint = %q (%d bytes), want ckpt-2.pt (%d bytes)", name, len(data), len(big))
	}
	if final.LastSeq != uint64(len(src.recs)) {
		t.Errorf("final last seq %d, %d records held", final.LastSeq, len(src.recs))
	}

	src2 := newMemSource()
	l2 := newTestLoop(src2, t.TempDir())
	l2.DrainTimeout = 10 * time.Second
	b := &Assignment{AllocID: "alloc-0000c0c0", FencingToken: 2, ResumeAfterSeq: 40, ResumeCheckpointName: "ckpt-2.pt", ResumeCheckpoint: []byte("weights"),
		Command: []string{"sh", "-c", `echo "resume from $(basename "$GPUPASS_RESUME_FROM"): $(cat "$GPUPASS_RESUME_FROM")"`}}
	if final := l2.RunAssignment(context.Background(), b); final.State != StateSucceeded {
		t.Fatalf("resumed run ended %s (%s)", final.State, final.Reason)
	}
	if msgs := src2.messages(t); !contains(msgs, "resume from ckpt-2.pt: weights") {
		t.Errorf("the resumed command did not start from the shipped checkpoint: %q", msgs)
	}
	bad := &Assignment{AllocID: "alloc-0000c0c1", FencingToken: 2, ResumeAfterSeq: 40, ResumeCheckpointName: "../evil", ResumeCheckpoint: []byte("x"), Command: []string{"true"}}
	if final := l2.RunAssignment(context.Background(), bad); final.State != StateFailed || !strings.Contains(final.Reason, "plain file name") {
		t.Errorf("checkpoint named ../evil: %s (%s)", final.State, final.Reason)
	}
}

// TestSpoolOnFullDisk: the agent's state dir on a small tmpfs fills up
// under a chatty job. The run fails with a reason naming the spool, what
// the spool took before is delivered whole (seq 1..N, no gap), and then
// the final state. Needs root to mount the tmpfs; without it, the spool's
// own injected-writer test (agent/spool TestFullDiskInjected) covers the
// spool side.
func TestSpoolOnFullDisk(t *testing.T) {
	t.Parallel()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); agent/spool TestFullDiskInjected covers a full spool", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	src := newMemSource()
	l := newTestLoop(src, mnt)
	l.DrainTimeout = 20 * time.Second
	a := &Assignment{AllocID: "alloc-0000f011", FencingToken: 1, Command: []string{"sh", "-c", "yes 'a line of output that fills the disk'"}, Grace: time.Second}
	final := l.RunAssignment(context.Background(), a)
	if final.State != StateFailed || !strings.Contains(final.Reason, "no space left on device") || !strings.Contains(final.Reason, filepath.Join(mnt, "spool", a.AllocID)) {
		t.Fatalf("run ended %s (%s), want failed naming the spool and the full disk", final.State, final.Reason)
	}
	if diff := cmp.Diff([]AllocState{StateStarting, StateRunning, StateFailed}, src.states()); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	n, atEnd := src.held()
	if n == 0 || atEnd != n || uint64(n) != final.LastSeq {
		t.Errorf("held %d records (%d when the final state came), last seq %d", n, atEnd, final.LastSeq)
	}
	msgs := src.messages(t) // fails on a gap
	if !contains(msgs, "a line of output") {
		t.Errorf("no output line held")
	}
	if !gone(mnt, a.AllocID) {
		t.Errorf("the delivered run's spool or ledger is still on the full disk")
	}
}

// TestUnsafeAllocIDTouchesNothing: the broker's allocation id names the
// run's work dir, spool and ledger under the state dir. An id that is not
// a plain name is refused (and reported failed) before any of them is
// made: with "..", the work dir would be the state dir (the run's
// tarball writing agent.key) and dropping the run's spool would remove
// the state dir; with "", every run's spool would go.
func TestUnsafeAllocIDTouchesNothing(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"..", ".", "", "../..", "alloc-1/../..", "/tmp", "alloc-x.json", "alloc-", "alloc-a\x00b", "ALLOC-1", "x" + strings.Repeat("y", 100)} {
		t.Run(fmt.Sprintf("%q", id), func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			key := filepath.Join(state, KeyFile)
			other := filepath.Join(state, "spool", "alloc-other")
			for p, body := range map[string]string{key: "identity", filepath.Join(other, "seg"): "records", other + ".json": `{"alloc_id":"alloc-other"}`} {
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			before := tree(t, state)
			src := newMemSource()
			l := newTestLoop(src, state)
			final := l.RunAssignment(t.Context(), &Assignment{AllocID: id, FencingToken: 1, Command: []string{"true"},
				Workdir: tarball(t, map[string]string{KeyFile: "the run's own key"})})
			l.WaitFinished()
			if final.State != StateFailed || !strings.Contains(final.Reason, "not a plain name") {
				t.Errorf("final %s (%s), want failed: not a plain name", final.State, final.Reason)
			}
			if diff := cmp.Diff([]AllocState{StateFailed}, src.states()); diff != "" {
				t.Errorf("updates sent (-want +got):\n%s", diff)
			}
			l.dropRun(l.log(), id, spool.Stats{})
			if diff := cmp.Diff(before, tree(t, state)); diff != "" {
				t.Errorf("the state dir changed (-before +after):\n%s", diff)
			}
		})
	}
}

// tree maps every file under dir to its content.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[strings.TrimPrefix(p, dir)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOldWorkDirsPruned: as a run starts, the work dirs of earlier runs
// past the newest KeepRuns-1 go (their checkpoints would fill the disk),
// anything under runs/ that is not a run's dir stays, and a work dir left
// by an earlier placement of the same run is cleared, symlinks and all.
func TestOldWorkDirsPruned(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	runs := filepath.Join(state, "runs")
	now := time.Now()
	for i, id := range []string{"alloc-00000001", "alloc-00000002", "alloc-00000003", "notes"} {
		d := filepath.Join(runs, id)
		if err := os.MkdirAll(filepath.Join(d, "checkpoints"), 0o755); err != nil {
			t.Fatal(err)
		}
		mod := now.Add(time.Duration(i-4) * time.Hour)
		if err := os.Chtimes(d, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	again := filepath.Join(runs, "alloc-00000009")
	if err := os.MkdirAll(again, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(state, filepath.Join(again, "checkpoints")); err != nil {
		t.Fatal(err)
	}
	l := newTestLoop(newMemSource(), state)
	l.KeepRuns = 2
	final := l.RunAssignment(t.Context(), &Assignment{AllocID: "alloc-00000009", FencingToken: 2,
		Command: []string{"sh", "-c", `test ! -L checkpoints && ls "$GPUPASS_CHECKPOINT_DIR"`}})
	l.WaitFinished()
	if final.State != StateSucceeded {
		t.Fatalf("run %s (%s): the earlier placement's symlink was not cleared", final.State, final.Reason)
	}
	var left []string
	ents, err := os.ReadDir(runs)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if diff := cmp.Diff([]string{"alloc-00000003", "alloc-00000009", "notes"}, left); diff != "" {
		t.Errorf("work dirs left (-want +got):\n%s", diff)
	}

	// 0 keeps them all.
	l = newTestLoop(newMemSource(), state)
	l.RunAssignment(t.Context(), &Assignment{AllocID: "alloc-00000010", FencingToken: 1, Command: []string{"true"}})
	l.WaitFinished()
	if ents, _ := os.ReadDir(runs); len(ents) != 4 {
		t.Errorf("KeepRuns 0 deleted work dirs: %d left, want 4", len(ents))
	}
}

// TestFinalCheckpointShipped: a checkpoint the job writes as its last act
// (no tick of the watcher sees it settle while the run runs) is shipped
// once the job exited, before the run's end is reported: it is the
// run's model, what `gpupass model push` pushes.
func TestFinalCheckpointShipped(t *testing.T) {
	t.Parallel()
	src := newMemSource()
	l := newTestLoop(src, t.TempDir())
	l.DrainTimeout = 10 * time.Second
	job := `d="$GPUPASS_CHECKPOINT_DIR"; mkdir -p "$d"; echo early > "$d/ckpt-1.pt"; sleep 1.5; echo final > "$d/ckpt-2.pt"`
	a := &Assignment{AllocID: "alloc-0000c0c1", FencingToken: 1, Command: []string{"sh", "-c", job}}
	final := l.RunAssignment(context.Background(), a)
	if final.State != StateSucceeded {
		t.Fatalf("run ended %s (%s)", final.State, final.Reason)
	}
	var asm api.CheckpointAssembler
	src.mu.Lock()
	for seq := uint64(1); seq <= uint64(len(src.recs)); seq++ {
		if r := src.recs[seq]; r.Kind == spool.KindCheckpoint {
			if err := asm.Add(r.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	n := len(src.recs)
	src.mu.Unlock()
	if name, data := asm.Newest(); name != "ckpt-2.pt" || string(data) != "final\n" {
		t.Fatalf("newest shipped checkpoint = %q %q, want ckpt-2.pt, the one written last", name, data)
	}
	if final.LastSeq != uint64(n) {
		t.Errorf("final last seq %d, %d records held: the final checkpoint's records are not counted", final.LastSeq, n)
	}
}
