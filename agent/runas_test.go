package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/testutil"
)

// Not parallel: it replaces geteuid, which parallel tests' Validate reads.
func TestRunAsNeedsRoot(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	o := &Options{StorageClass: "standard", SuiteInterval: time.Hour, RunAs: "nobody"}
	geteuid = func() int { return 1000 }
	if err := o.Validate(false); err == nil || !strings.Contains(err.Error(), `job user "nobody": starting jobs as another user needs the agent to run as root (it runs as uid 1000)`) {
		t.Errorf("Validate as uid 1000 = %v, want the root requirement", err)
	}
	geteuid = func() int { return 0 }
	if err := o.Validate(false); err != nil || o.runAs == nil || o.runAs.UID != 65534 {
		t.Errorf("Validate as root = %v (run as %+v), want nobody resolved", err, o.runAs)
	}
	o = &Options{StorageClass: "standard", SuiteInterval: time.Hour, RunAs: "root"}
	if err := o.Validate(false); err == nil || !strings.Contains(err.Error(), "is root") {
		t.Errorf("--run-as root: Validate = %v, want a refusal", err)
	}
}

// With --run-as the state dir lets the job reach its work dir under
// runs/ and nothing else: the job cannot read the identity key.
func TestRunAsKeepsTheKeyFromTheJob(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	parent := testutil.TempDirMode(t, 0o711)
	o := &Options{
		StateDir: filepath.Join(parent, "state"), Region: "us-west-2", StorageClass: "standard",
		Simulate: "h100-sxm5-8x", Python: "python3", SuiteInterval: time.Hour, ReadProbeMB: 1, RunAs: "nobody",
	}
	if err := o.Validate(false); err != nil {
		t.Fatal(err)
	}
	if _, err := New(o, quiet()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(o.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o711 {
		t.Fatalf("state dir mode %04o, want 0711 (passable, not listable)", fi.Mode().Perm())
	}
	src := newMemSource()
	l := &RunLoop{
		Source: src, AgentID: func() string { return "agent-1" },
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
		StateDir: o.StateDir, Python: "/usr/bin/python3", RunAs: o.runAs,
		UpdateEvery: 20 * time.Millisecond, DrainTimeout: 10 * time.Second,
	}
	job := "id -u\nif cat ../../" + KeyFile + "; then echo key-read; else echo key-refused; fi\nls ../.. || echo state-dir-unlisted\n"
	a := Assignment{AllocID: "alloc-0000runas", FencingToken: 1, Command: []string{"sh", "job.sh"}, Workdir: tarball(t, map[string]string{"job.sh": job})}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	final := l.RunAssignment(ctx, &a)
	if final.State != StateSucceeded {
		t.Fatalf("run %s: %s", final.State, final.Reason)
	}
	msgs := src.messages(t)
	for _, w := range []string{"65534", "key-refused", "state-dir-unlisted"} {
		if !contains(msgs, w) {
			t.Errorf("no event says %q; events: %q", w, msgs)
		}
	}
	for _, w := range []string{"PRIVATE KEY", "key-read", KeyFile + "\n"} {
		if contains(msgs, w) {
			t.Errorf("an event says %q: the job reached the key; events: %q", w, msgs)
		}
	}

	// The next run has the same uid: the first run's work dir (kept,
	// --keep-runs) is closed to it.
	src2 := newMemSource()
	l.Source = src2
	next := "id -u\nif ls ../alloc-0000runas; then echo previous-run-open; else echo previous-run-closed; fi\n"
	b := Assignment{AllocID: "alloc-0000next", FencingToken: 1, Command: []string{"sh", "job.sh"}, Workdir: tarball(t, map[string]string{"job.sh": next})}
	if final := l.RunAssignment(ctx, &b); final.State != StateSucceeded {
		t.Fatalf("second run %s: %s", final.State, final.Reason)
	}
	if msgs := src2.messages(t); !contains(msgs, "previous-run-closed") || contains(msgs, "previous-run-open") {
		t.Errorf("the second job reached the first one's work dir; events: %q", msgs)
	}
}

// With --run-as the checkpoint shipper (root) reads only the job's own
// files: a checkpoint that is someone else's file (a hard link to the
// key, a dir swapped for a link to the state dir) is not sent to the
// broker, where the run's submitter could download it.
func TestCheckpointShipperReadsOnlyTheJobsFiles(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ck := filepath.Join(dir, "step1.pt")
	if err := os.WriteFile(ck, []byte("weights"), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	c := &ckptShipper{dir: dir, app: sp, log: quiet(), runAs: nobody}
	kinds := func() (ckpts int, msgs []string) {
		recs, err := sp.Pending(0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			switch r.Kind {
			case spool.KindCheckpoint:
				ckpts++
			case spool.KindEvent:
				e, err := executor.DecodeEvent(r)
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, e.Message)
			}
		}
		return ckpts, msgs
	}
	c.tick(time.Now())
	if n, msgs := kinds(); n != 0 || !contains(msgs, "step1.pt not shipped: ") || !contains(msgs, "does not belong to the job's user nobody") {
		t.Fatalf("root's file: %d checkpoint records, events %q; want none and a warning", n, msgs)
	}
	c.tick(time.Now()) // the same file: not warned about again
	if _, msgs := kinds(); len(msgs) != 1 {
		t.Errorf("events after a second look: %q, want the one warning", msgs)
	}
	if err := os.Chown(ck, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(ck, later, later); err != nil {
		t.Fatal(err)
	}
	c.tick(later.Add(time.Second))
	if n, msgs := kinds(); n == 0 || !contains(msgs, "step1.pt (7 bytes) shipped") {
		t.Errorf("the job's file: %d checkpoint records, events %q; want it shipped", n, msgs)
	}
}

// With --run-as the agent refuses at start a state dir its jobs could not
// reach, naming the directory in the way; before, every run failed at
// chdir once it was placed.
func TestRunAsStateDirOutOfReach(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	closed := testutil.TempDirMode(t, 0o700) // nobody cannot pass
	o := &Options{
		StateDir: filepath.Join(closed, "state"), Region: "us-west-2", StorageClass: "standard",
		Simulate: "h100-sxm5-8x", Python: "python3", SuiteInterval: time.Hour, ReadProbeMB: 1, RunAs: "nobody",
	}
	if err := o.Validate(false); err != nil {
		t.Fatal(err)
	}
	_, err := New(o, quiet())
	if err == nil || !strings.Contains(err.Error(), `job user "nobody": `+closed+" (mode 0700, owner uid 0) does not let nobody") || !strings.Contains(err.Error(), "chmod o+x "+closed) {
		t.Fatalf("New = %v, want the closed directory named with the fix", err)
	}
}
