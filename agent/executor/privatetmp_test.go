package executor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/testutil"
)

// leakJob is run 1's job: it leaves name in /tmp, /var/tmp and (64 MiB,
// memory held) /dev/shm, checks it can use them itself, and says what its
// /dev/shm is.
func leakJob(name string) string {
	return `set -e
echo secret > /tmp/` + name + `
echo secret > /var/tmp/` + name + `
dd if=/dev/zero of=/dev/shm/` + name + ` bs=1M count=64 2>/dev/null
echo "own-tmp=$(cat /tmp/` + name + `) shm-bytes=$(stat -c %s /dev/shm/` + name + `)"
echo "shm-fs=$(stat -f -c %T /dev/shm) shm-kb=$(df -k /dev/shm | awk 'NR==2 {print $2}')"
grep -o ' - tmpfs gpupass-[^ ]*' /proc/self/mountinfo || true
echo mine > "$TMPDIR/t"; echo "tmpdir-is-tmp=$(cat /tmp/t 2>/dev/null) tmpdir=$TMPDIR"
echo '{"step":1,"loss":0.5}' >> "$GPUPASS_METRICS_FILE"
`
}

// lookJob is run 2's: it says which of run 1's files it finds.
func lookJob(name string) string {
	return `for f in /tmp/` + name + ` /var/tmp/` + name + ` /dev/shm/` + name + `; do
  if [ -e "$f" ]; then echo "found $f: $(head -c 6 "$f")"; else echo "no $f"; fi
done
`
}

// Files a run leaves in /tmp, /var/tmp and /dev/shm do not reach the next
// run as the same user (--run-as UID:GID: one uid for every run, a cgroup
// per run), and nothing of them is left on the node once the run ends:
// with a private /tmp and /dev/shm (a mount namespace; the /dev/shm tmpfs
// and its memory are gone with the run), and without (what the run added
// to the node's dirs is removed at its end).
func TestRunTmpDoesNotReachTheNextRun(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	for _, tc := range []struct {
		name    string
		private bool
		// runAs is the --run-as user of both runs: a uid no other
		// test's runs have, whose sweep would take this test's files.
		runAs string
	}{
		{"private tmp", true, "230990:230990"},
		{"swept at the end", false, "230991:230991"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runAs, err := executor.LookupRunAs(tc.runAs)
			if err != nil {
				t.Fatal(err)
			}
			host := &local.Host{Cgroups: cgroups(t)}
			x := &executor.Executor{Runner: local.ProcessRunner{}, Host: host}
			if tc.private {
				host.PrivateTmp = &local.PrivateTmp{ShmSize: "256m"}
			}
			// Below /tmp, as t.TempDir is: the run still sees its work
			// dir there.
			root := testutil.TempDirMode(t, 0o711)
			work := filepath.Join(root, "runs")
			name := fmt.Sprintf("gpupass-leak-%d-%t", os.Getpid(), tc.private)
			leftovers := []string{"/tmp/" + name, "/var/tmp/" + name, "/dev/shm/" + name}
			t.Cleanup(func() {
				for _, p := range leftovers {
					os.Remove(p)
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			alloc1 := "alloc-tmp-first-" + map[bool]string{true: "ns", false: "sweep"}[tc.private]
			out := execute(t, ctx, executor.Job{AllocID: alloc1, Command: []string{"/bin/sh", "-c", leakJob(name)}, WorkRoot: work, RunAs: runAs}, x)
			said := lines(out.find("stdout"))
			if out.res.State != executor.Succeeded {
				t.Fatalf("run 1 %s: %s\n%s", out.res.State, out.res.Reason, lines(out.events))
			}
			if !strings.Contains(said, "own-tmp=secret shm-bytes=67108864") || len(out.metrics) != 1 {
				t.Fatalf("run 1 could not use its /tmp, /dev/shm or work dir (%d metric points):\n%s", len(out.metrics), lines(out.events))
			}
			var mode string
			for _, e := range out.events {
				if m, ok := e.Fields["private_tmp"]; ok {
					mode = m
				}
			}
			if tc.private {
				// size=256m: the tmpfs is the run's own, bounded.
				for _, want := range []string{"shm-fs=tmpfs shm-kb=262144", "tmpdir-is-tmp=mine tmpdir=/tmp", " - tmpfs gpupass-" + alloc1} {
					if !strings.Contains(said, want) {
						t.Errorf("run 1 said %q, want %q", said, want)
					}
				}
				if !strings.Contains(mode, "mount namespace") {
					t.Errorf("run 1's start event says private_tmp=%q, want the mount namespace named", mode)
				}
				if got := testutil.MountsOf("gpupass-" + alloc1); len(got) > 0 {
					t.Errorf("run 1's /dev/shm tmpfs is still mounted after the run (memory held): %q", got)
				}
			} else if !strings.HasPrefix(mode, "no:") {
				t.Errorf("run 1's start event says private_tmp=%q, want no", mode)
			}
			for _, p := range leftovers {
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s is on the node after run 1 ended (%v)", p, err)
				}
			}

			out = execute(t, ctx, executor.Job{AllocID: alloc1 + "-next", Command: []string{"/bin/sh", "-c", lookJob(name)}, WorkRoot: work, RunAs: runAs}, x)
			said = lines(out.find("stdout"))
			if out.res.State != executor.Succeeded {
				t.Fatalf("run 2 %s: %s\n%s", out.res.State, out.res.Reason, lines(out.events))
			}
			for _, p := range leftovers {
				if !strings.Contains(said, "no "+p) {
					t.Errorf("run 2 (same user) reached run 1's %s:\n%s", p, said)
				}
			}
		})
	}
}

// A private /tmp still shows what runs need below the node's /tmp or
// /dev/shm (here the state dir, as an operator may put it there) and
// nothing else of them; /tmp or /dev/shm itself is never kept.
func TestPrivateTmpKeepsTheStateDir(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	state := testutil.TempDirMode(t, 0o711)
	if err := os.WriteFile(filepath.Join(state, "kept"), []byte("here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	shm, err := os.MkdirTemp("/dev/shm", "gpupass-test-keep-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	if err := os.WriteFile(filepath.Join(shm, "kept"), []byte("in-shm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{PrivateTmp: &local.PrivateTmp{Keep: []string{state, "/tmp", shm, "/dev/shm"}}}}
	out := execute(t, context.Background(), executor.Job{Command: []string{"/bin/sh", "-c", "cat " + filepath.Join(state, "kept") + " " + filepath.Join(shm, "kept") + "; ls " + other + " 2>/dev/null || echo other-hidden; pwd"},
		WorkRoot: filepath.Join(state, "runs")}, x)
	said := lines(out.find("stdout"))
	if out.res.State != executor.Succeeded {
		t.Fatalf("run %s: %s\n%s", out.res.State, out.res.Reason, lines(out.events))
	}
	for _, want := range []string{"here", "in-shm", "other-hidden", filepath.Join(state, "runs", "alloc-0000test")} {
		if !strings.Contains(said, want) {
			t.Errorf("job said %q, want %q", said, want)
		}
	}
}

func TestCheckShmSize(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{"50%": "", "16g": "", "1048576": "", "512M": "", "0": "more than 0", "101%": "at most 100%", "16gb": "not a size", "": "not a size", "-1": "not a size", "g": "not a size"} {
		err := local.CheckShmSize(s)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("CheckShmSize(%q) = %v, want %q", s, err, want)
		}
	}
}

// A Runner that runs the job elsewhere (a Slurm compute node, a pod)
// leaves this node's /tmp alone: what the agent's uid adds there during
// the run (here a file made as the run started, as the user's own shell
// on a login node would) is not the run's, and no start event says it
// would be removed.
func TestRemoteRunnerLeavesTheNodesTmpAlone(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	// A uid of this test's own (not root, whose files are never swept),
	// as a non-root agent's would be.
	runAs, err := executor.LookupRunAs("230993:230993")
	if err != nil {
		t.Fatal(err)
	}
	other := fmt.Sprintf("/tmp/gpupass-test-remote-%d", os.Getpid())
	t.Cleanup(func() { os.Remove(other) })
	remote := runnerFunc(func(executor.Attempt) executor.Exit {
		if err := os.WriteFile(other, []byte("mine"), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Lchown(other, int(runAs.UID), int(runAs.GID)); err != nil {
			t.Error(err)
		}
		return executor.Exit{}
	})
	out := execute(t, context.Background(), executor.Job{Command: []string{"train"}, RunAs: runAs}, &executor.Executor{Runner: remote})
	if out.res.State != executor.Succeeded {
		t.Fatalf("run %s: %s\n%s", out.res.State, out.res.Reason, lines(out.events))
	}
	if _, err := os.Lstat(other); err != nil {
		t.Errorf("%s, made on this node while the run went on elsewhere, is gone after it: %v", other, err)
	}
	for _, e := range out.events {
		if m, ok := e.Fields["private_tmp"]; ok {
			t.Errorf("the start event says private_tmp=%q of a run that is not on this node", m)
		}
	}
}
