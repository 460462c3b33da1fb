package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/agent/uploader"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/spec"
)

// memSource is an in-process broker for the run loop: it stores records
// by seq the way the broker does (insert if absent, answer the gap-free
// prefix) and records every allocation update.
type memSource struct {
	mu      sync.Mutex
	updates []AllocUpdate
	recs    map[uint64]spool.Record
	// cancelAfter asks for a cancel once this many running updates came.
	cancelAfter int
	// staleAfter refuses the lease once this many running updates came.
	staleAfter int
	running    int
	work       chan *Assignment
	// uploadErr is returned by every Upload while set (a broker away).
	uploadErr error
	// heldAtEnd is how many records were held when a terminal state came.
	heldAtEnd int
}

func (m *memSource) setUploadErr(err error) {
	m.mu.Lock()
	m.uploadErr = err
	m.mu.Unlock()
}

func newMemSource() *memSource {
	return &memSource{recs: map[uint64]spool.Record{}, work: make(chan *Assignment, 1)}
}

func (m *memSource) PollWork(ctx context.Context, _ string) (*Assignment, error) {
	select {
	case a := <-m.work:
		return a, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(50 * time.Millisecond):
		return nil, nil
	}
}

func (m *memSource) UpdateAllocation(_ context.Context, u AllocUpdate) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if u.State == StateRunning {
		m.running++
		if m.staleAfter > 0 && m.running > m.staleAfter {
			return false, ErrStaleLease
		}
	}
	if n := len(m.updates); n == 0 || m.updates[n-1].State != u.State {
		m.updates = append(m.updates, u)
		if u.State == StateSucceeded || u.State == StateFailed || u.State == StateCancelled {
			m.heldAtEnd = len(m.recs)
		}
	}
	return m.cancelAfter > 0 && m.running > m.cancelAfter, nil
}

func (m *memSource) Sink(*Assignment) uploader.Sink { return m }

func (m *memSource) Upload(_ context.Context, _ string, recs []spool.Record) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.uploadErr != nil {
		return 0, m.uploadErr
	}
	for _, r := range recs {
		if _, ok := m.recs[r.Seq]; !ok {
			m.recs[r.Seq] = r
		}
	}
	var held uint64
	for {
		if _, ok := m.recs[held+1]; !ok {
			return held, nil
		}
		held++
	}
}

func (m *memSource) states() []AllocState {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []AllocState
	for _, u := range m.updates {
		out = append(out, u.State)
	}
	return out
}

// messages decodes the stored events, in seq order, checking that the
// seqs are exactly 1..n.
func (m *memSource) messages(t *testing.T) []string {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for seq := uint64(1); seq <= uint64(len(m.recs)); seq++ {
		r, ok := m.recs[seq]
		if !ok {
			t.Fatalf("stored records have a gap at seq %d (of %d)", seq, len(m.recs))
		}
		if r.Kind != spool.KindEvent {
			continue
		}
		ev, err := executor.DecodeEvent(r)
		if err != nil {
			t.Fatalf("decoding event %d: %v", seq, err)
		}
		out = append(out, ev.Message)
	}
	return out
}

func tarball(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func contains(msgs []string, sub string) bool {
	for _, m := range msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

func TestRunAssignment(t *testing.T) {
	t.Parallel()
	nonConforming := func(context.Context, *spec.Spec) ([]conformance.Check, error) {
		return []conformance.Check{{Name: "gpu.foreign_processes", Expected: "0", Actual: "1", Status: conformance.Fail, Message: "GPU 0: pid 4242 (900 MiB)"}}, nil
	}
	tests := []struct {
		name        string
		a           Assignment
		recheck     func(context.Context, *spec.Spec) ([]conformance.Check, error)
		cancelAfter int
		staleAfter  int
		wantStates  []AllocState
		wantState   AllocState
		wantReason  string
		wantMsgs    []string
		notMsgs     []string
	}{
		{
			name: "workdir unpacked and run to success",
			a: Assignment{
				Command: []string{"sh", "job.sh"},
				Workdir: tarball(t, map[string]string{"job.sh": "echo hello from $GPUPASS_REGION\necho 'gpupass:metric {\"step\":1,\"loss\":0.5}'\n"}),
				Spec:    []byte(`{"name":"x","runtime":{},"security":{},"resources":{}}`),
				Region:  "eu-central-1",
			},
			wantStates: []AllocState{StateStarting, StateRunning, StateSucceeded},
			wantState:  StateSucceeded,
			wantMsgs:   []string{"hello from eu-central-1", "running under this node's lease"},
		},
		{
			name:       "non-zero exit fails with the code",
			a:          Assignment{Command: []string{"sh", "-c", "echo bad; exit 3"}},
			wantStates: []AllocState{StateStarting, StateRunning, StateFailed},
			wantState:  StateFailed,
			wantReason: "3",
			wantMsgs:   []string{"bad"},
		},
		{
			name:       "conformance re-check refuses the node before the command",
			a:          Assignment{Command: []string{"sh", "-c", "echo must-not-run"}, Spec: []byte(`{"name":"x"}`)},
			recheck:    nonConforming,
			wantStates: []AllocState{StateStarting, StateFailed},
			wantState:  StateFailed,
			wantReason: "gpu.foreign_processes expected 0, found 1 (GPU 0: pid 4242",
			notMsgs:    []string{"must-not-run"},
		},
		{
			// The broker (or anything between it and the node) sends a spec
			// other than the one submitted: the node would run it and sign
			// a report for it.
			name: "a spec other than the submitted one is refused before the command",
			a: Assignment{Command: []string{"sh", "-c", "echo must-not-run"}, Spec: []byte(`{"name":"x","runtime":{"cuda":"12.2"}}`),
				SpecFingerprint: fingerprintOf(t, `{"name":"x","runtime":{"cuda":"12.1"}}`)},
			wantStates: []AllocState{StateStarting, StateFailed},
			wantState:  StateFailed,
			wantReason: "refusing to run a spec other than the one submitted",
			notMsgs:    []string{"must-not-run"},
		},
		{
			// The spec stripped on the way, its fingerprint kept: without a
			// spec the node would run the command with no conformance
			// re-check at all.
			name: "a fingerprint without its spec is refused before the command",
			a: Assignment{Command: []string{"sh", "-c", "echo must-not-run"},
				SpecFingerprint: fingerprintOf(t, `{"name":"x","runtime":{"cuda":"12.1"}}`)},
			recheck:    nonConforming,
			wantStates: []AllocState{StateStarting, StateFailed},
			wantState:  StateFailed,
			wantReason: "refusing to run a spec other than the one submitted",
			notMsgs:    []string{"must-not-run"},
		},
		{
			name: "the submitted spec runs",
			a: Assignment{Command: []string{"sh", "-c", "echo ran"}, Spec: []byte(`{"name":"x","runtime":{"cuda":"12.1"}}`),
				SpecFingerprint: fingerprintOf(t, `{"name":"x","runtime":{"cuda":"12.1"}}`)},
			wantStates: []AllocState{StateStarting, StateRunning, StateSucceeded},
			wantState:  StateSucceeded,
			wantMsgs:   []string{"ran"},
		},
		{
			// The wire form is JSON only; the agent no longer guesses
			// (json.Valid) and parses anything else as YAML.
			name:       "a spec not in the wire form is refused",
			a:          Assignment{Command: []string{"sh", "-c", "echo must-not-run"}, Spec: []byte("name: x\nruntime:\n  cuda: \"12.1\"\n")},
			wantStates: []AllocState{StateStarting, StateFailed},
			wantState:  StateFailed,
			wantReason: "decoding the spec (JSON)",
			notMsgs:    []string{"must-not-run"},
		},
		{
			name:        "cancel requested by the broker stops the command",
			a:           Assignment{Command: []string{"sh", "-c", "echo started; exec sleep 60"}, Grace: time.Second},
			cancelAfter: 2,
			wantStates:  []AllocState{StateStarting, StateRunning, StateCancelled},
			wantState:   StateCancelled,
			wantMsgs:    []string{"started"},
		},
		{
			name:       "stale fencing token stops the run with no final update",
			a:          Assignment{Command: []string{"sh", "-c", "echo started; exec sleep 60"}, Grace: time.Second},
			staleAfter: 2,
			wantStates: []AllocState{StateStarting, StateRunning},
			wantState:  StateCancelled,
			wantReason: "stale fencing token",
		},
		{
			name:       "archive escaping the work dir is refused",
			a:          Assignment{Command: []string{"true"}, Workdir: tarball(t, map[string]string{"../evil": "x"})},
			wantStates: []AllocState{StateStarting, StateFailed},
			wantState:  StateFailed,
			wantReason: `entry "../evil" leaves the work dir`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newMemSource()
			src.cancelAfter, src.staleAfter = tc.cancelAfter, tc.staleAfter
			l := &RunLoop{
				Source: src, AgentID: func() string { return "agent-1" },
				Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
				StateDir: t.TempDir(), Python: "/usr/bin/python3", Recheck: tc.recheck,
				UpdateEvery: 20 * time.Millisecond, DrainTimeout: 10 * time.Second,
			}
			a := tc.a
			a.AllocID, a.FencingToken = "alloc-0000abcd", 7
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			final := l.RunAssignment(ctx, &a)
			if final.State != tc.wantState {
				t.Errorf("final state = %s (%s), want %s", final.State, final.Reason, tc.wantState)
			}
			if !strings.Contains(final.Reason+" "+strconv.Itoa(final.ExitCode), tc.wantReason) {
				t.Errorf("final reason %q (exit %d) does not say %q", final.Reason, final.ExitCode, tc.wantReason)
			}
			if diff := cmp.Diff(tc.wantStates, src.states()); diff != "" {
				t.Errorf("states reported (-want +got):\n%s", diff)
			}
			msgs := src.messages(t)
			for _, w := range tc.wantMsgs {
				if !contains(msgs, w) {
					t.Errorf("no stored event says %q; events: %q", w, msgs)
				}
			}
			for _, w := range tc.notMsgs {
				if contains(msgs, w) {
					t.Errorf("an event says %q, which must not happen", w)
				}
			}
			if final.State == StateSucceeded && final.LastSeq != uint64(len(src.recs)) {
				t.Errorf("final last_seq %d, broker holds %d records", final.LastSeq, len(src.recs))
			}
		})
	}
}

func TestRunLoopTakesWorkUntilStopped(t *testing.T) {
	t.Parallel()
	src := newMemSource()
	l := &RunLoop{
		Source: src, AgentID: func() string { return "agent-1" },
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
		StateDir: t.TempDir(), UpdateEvery: 20 * time.Millisecond,
	}
	// Busy holds the agent's periodic suite while the run is in progress.
	var calls, inRun atomic.Int32
	var busyWhileRunning atomic.Bool
	l.Busy = func() func() {
		calls.Add(1)
		inRun.Add(1)
		return func() { inRun.Add(-1) }
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	src.work <- &Assignment{AllocID: "alloc-00000001", FencingToken: 1, Command: []string{"sh", "-c", "echo one; sleep 0.3"}}
	deadline := time.After(30 * time.Second)
	for !contains(stateStrings(src.states()), string(StateSucceeded)) {
		if contains(stateStrings(src.states()), string(StateRunning)) && inRun.Load() == 1 {
			busyWhileRunning.Store(true)
		}
		select {
		case <-deadline:
			t.Fatalf("run never succeeded; states %v", src.states())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if calls.Load() != 1 || inRun.Load() != 0 || !busyWhileRunning.Load() {
		t.Errorf("Busy called %d times, %d left busy, busy while running: %v; want 1, 0, true", calls.Load(), inRun.Load(), busyWhileRunning.Load())
	}
}

func stateStrings(s []AllocState) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = string(x)
	}
	return out
}

// fingerprintOf is spec.Fingerprint of a spec in its wire form.
func fingerprintOf(t *testing.T, wire string) string {
	t.Helper()
	sp, err := spec.Decode([]byte(wire))
	if err != nil {
		t.Fatal(err)
	}
	fp, err := spec.Fingerprint(sp)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
