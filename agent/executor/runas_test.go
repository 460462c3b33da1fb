package executor_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/testutil"
)

func TestLookupRunAs(t *testing.T) {
	t.Parallel()
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatalf("nobody: %v", err)
	}
	if nobody.UID != 65534 || nobody.Name != "nobody" {
		t.Errorf("nobody = %+v, want uid 65534", nobody)
	}
	if got := nobody.String(); got != "nobody (uid 65534, gid 65534)" {
		t.Errorf("String() = %q", got)
	}
	byID, err := executor.LookupRunAs("65534")
	if err != nil || byID.UID != 65534 || byID.GID != nobody.GID || byID.Name != "nobody" {
		t.Errorf(`"65534" = %+v, %v; want nobody's uid and gid`, byID, err)
	}
	unlisted, err := executor.LookupRunAs("23456:34567")
	if err != nil || unlisted.UID != 23456 || unlisted.GID != 34567 || unlisted.Name != "" {
		t.Errorf(`"23456:34567" = %+v, %v`, unlisted, err)
	}
	if got := unlisted.String(); got != "uid 23456 (gid 34567)" {
		t.Errorf("String() = %q", got)
	}
	withGroup, err := executor.LookupRunAs("nobody:0")
	if err != nil || withGroup.UID != 65534 || withGroup.GID != 0 {
		t.Errorf(`"nobody:0" = %+v, %v; want uid 65534 gid 0`, withGroup, err)
	}
	for in, want := range map[string]string{
		"root":                     "is root",
		"0":                        "is root",
		"0:0":                      "is root",
		"23456":                    "give it as UID:GID",
		"no-such-user-gpupass":     "no such user",
		"nobody:no-such-group-gpu": "no such group",
		":65534":                   "want USER, UID",
		"nobody:":                  "want USER, UID",
		"99999999999:1":            "out of range",
	} {
		// In the executor's terms: the agent's command layer names
		// the flag.
		_, err := executor.LookupRunAs(in)
		var fe *fielderr.Error
		if !errors.As(err, &fe) || fe.Field != executor.FieldRunAs || fe.Value != in || !strings.Contains(err.Error(), want) {
			t.Errorf("LookupRunAs(%q) = %v, want a %q field error that says %q", in, err, executor.FieldRunAs, want)
		}
	}
}

// The job runs as --run-as: it writes its work dir, checkpoints and
// metrics, and cannot read the agent's 0600 files. The same job as the
// agent's own user reads them, which is what --run-as is for.
func TestRunAsAnotherUser(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	root := testutil.TempDirMode(t, 0o711)
	secret := filepath.Join(root, "agent.key")
	if err := os.WriteFile(secret, []byte("PRIVATE KEY MATERIAL\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `id -u; id -g
echo "home=$HOME user=$USER"
if cat "` + secret + `" 2>/dev/null; then echo secret-read; else echo secret-refused; fi
echo '{"step":1,"loss":0.5}' >> "$GPUPASS_METRICS_FILE"
echo ckpt > "$GPUPASS_CHECKPOINT_DIR/step1.pt" && echo ckpt-written
touch own-file && echo workdir-written
`
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("as nobody", func(t *testing.T) {
		work := filepath.Join(root, "runs")
		job := executor.Job{Command: []string{"/bin/sh", "-c", script}, WorkRoot: work, RunAs: nobody}
		out := execute(t, ctx, job, nil)
		if out.res.State != executor.Succeeded {
			t.Fatalf("run %s: %s", out.res.State, out.res.Reason)
		}
		stdout := lines(out.find("stdout"))
		wd := out.res.WorkDir
		for _, w := range []string{"65534", "home=" + wd + " user=nobody", "secret-refused", "ckpt-written", "workdir-written"} {
			if !strings.Contains(stdout, w) {
				t.Errorf("job output lacks %q:\n%s", w, stdout)
			}
		}
		if strings.Contains(stdout, "PRIVATE KEY") || strings.Contains(stdout, "secret-read") {
			t.Errorf("the job read the agent's key:\n%s", stdout)
		}
		if len(out.metrics) != 1 {
			t.Errorf("%d metric points, want the 1 the job wrote", len(out.metrics))
		}
		for _, p := range []string{filepath.Join(wd, "checkpoints"), filepath.Join(wd, "checkpoints", "step1.pt"), filepath.Join(wd, "metrics.jsonl"), filepath.Join(wd, "own-file")} {
			if st := stat(t, p); st.Uid != 65534 {
				t.Errorf("%s is owned by uid %d, want 65534", p, st.Uid)
			}
		}
		// The run is over: its dir is the agent's again, closed to the
		// next job, which runs as the same user.
		if st := stat(t, wd); st.Uid != uint32(os.Geteuid()) || st.Mode&0o777 != 0o700 {
			t.Errorf("work dir after the run: uid %d mode %04o, want the agent's uid %d and 0700", st.Uid, st.Mode&0o777, os.Geteuid())
		}
		var said bool
		for _, e := range out.find(events.ExecutorComp) {
			said = said || e.Fields["user"] == "nobody (uid 65534, gid 65534)"
		}
		if !said {
			t.Errorf("no executor event names the user the run ran as")
		}
	})
	t.Run("as the agent's user", func(t *testing.T) {
		job := executor.Job{Command: []string{"/bin/sh", "-c", script}, WorkRoot: filepath.Join(root, "runs-agent")}
		out := execute(t, ctx, job, nil)
		if stdout := lines(out.find("stdout")); !strings.Contains(stdout, "secret-read") {
			t.Errorf("as root the job should read the key (the hole --run-as closes); output:\n%s", stdout)
		}
	})
}

// A hard link in the work dir is someone else's file too: it is not
// handed to the job's user, and the run does not start.
func TestRunAsRefusesHardLinks(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	root := testutil.TempDirMode(t, 0o711)
	outside := filepath.Join(root, "outside")
	if err := os.WriteFile(outside, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(root, "runs")
	wd := filepath.Join(work, "alloc-0000test")
	if err := os.MkdirAll(wd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(outside, filepath.Join(wd, "linked")); err != nil {
		t.Fatal(err)
	}
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatal(err)
	}
	x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
	_, err = x.Execute(context.Background(), executor.Job{AllocID: "alloc-0000test", Command: []string{"true"}, WorkRoot: work, RunAs: nobody}, nil)
	if err == nil || !strings.Contains(err.Error(), "hard links") {
		t.Fatalf("Execute = %v, want a refusal naming the hard link", err)
	}
	if st := stat(t, outside); st.Uid != 0 {
		t.Errorf("the linked file now belongs to uid %d", st.Uid)
	}
}

func lines(evs []events.Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.Message + "\n")
	}
	return b.String()
}

func stat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

// The agent tails the metrics file as root and quotes bad lines in the
// run's events: under --run-as, a metrics file the job swapped for a link
// to the agent's key is not read.
func TestRunAsMetricsFileLinkedElsewhere(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	root := testutil.TempDirMode(t, 0o711)
	secret := filepath.Join(root, "agent.key")
	if err := os.WriteFile(secret, []byte("-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatal(err)
	}
	script := `rm "$GPUPASS_METRICS_FILE" && ln -s "` + secret + `" "$GPUPASS_METRICS_FILE" && echo linked; sleep 0.5`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := execute(t, ctx, executor.Job{Command: []string{"/bin/sh", "-c", script}, WorkRoot: filepath.Join(root, "runs"), RunAs: nobody}, nil)
	if !strings.Contains(lines(out.find("stdout")), "linked") {
		t.Fatalf("the job did not link the file: %s", lines(out.events))
	}
	all := lines(out.events)
	if strings.Contains(all, "PRIVATE KEY") || strings.Contains(all, "MIGHAgEA") {
		t.Errorf("the key reached the run's events:\n%s", all)
	}
	if !strings.Contains(lines(out.find(events.MetricsComp)), "GPUPASS_METRICS_FILE: ") {
		t.Errorf("no metrics warning says the file was not read:\n%s", all)
	}
}

// A FIFO in place of the metrics file would block the agent's tail (and
// so the end of the run) in open(2): it is refused instead.
func TestMetricsFileFIFODoesNotBlock(t *testing.T) {
	t.Parallel()
	script := `rm "$GPUPASS_METRICS_FILE" && mkfifo "$GPUPASS_METRICS_FILE" && echo fifo; sleep 0.5`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := execute(t, ctx, executor.Job{Command: []string{"/bin/sh", "-c", script}}, &executor.Executor{MetricsPoll: 20 * time.Millisecond})
	if out.res.State != executor.Succeeded || !strings.Contains(lines(out.find("stdout")), "fifo") {
		t.Fatalf("run %s (%s): %s", out.res.State, out.res.Reason, lines(out.events))
	}
	if w := lines(out.find(events.MetricsComp)); !strings.Contains(w, "is not a regular file (p") {
		t.Errorf("metrics events %q do not say the FIFO was not read", w)
	}
}

// CanReach applies the x bit that applies to the user: owner's, else the
// group's, else other's, as the kernel does.
func TestRunAsCanReach(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t)
	nobody, err := executor.LookupRunAs("nobody")
	if err != nil {
		t.Fatal(err)
	}
	root := testutil.TempDirMode(t, 0o711)
	for _, tc := range []struct {
		name     string
		mode     os.FileMode
		uid, gid int
		ok       bool
	}{
		{"other x", 0o701, 0, 0, true},
		{"no x for other", 0o770, 0, 0, false},
		{"group x, nobody's group", 0o710, 0, int(nobody.GID), true},
		{"owner without x, other x", 0o601, 65534, 0, false},
		{"owner x", 0o700, 65534, 0, true},
	} {
		d := filepath.Join(root, strings.ReplaceAll(tc.name, " ", "-"))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, tc.uid, tc.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, tc.mode); err != nil {
			t.Fatal(err)
		}
		err := nobody.CanReach(d)
		if tc.ok != (err == nil) {
			t.Errorf("%s (%04o %d:%d): CanReach = %v, want ok %v", tc.name, tc.mode, tc.uid, tc.gid, err, tc.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), d+" (mode ") || !strings.Contains(err.Error(), "chmod o+x "+d)) {
			t.Errorf("%s: error %q does not name %s and the fix", tc.name, err, d)
		}
	}
}
