package executor_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
)

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestLinkStepShell runs a link step's shell lines as a job's script
// would, with a stand-in for the measurement (the real one is torch's,
// run by the Slurm gang's e2e test): the result reaches Measured once,
// a failed measurement lets the command run and says why, and with
// MinGbps a figure below it ends the script with both figures before
// the command.
func TestLinkStepShell(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	const result = `{"backend": "gloo", "ranks": 2, "busbw_gbps": 4.5}`
	// The stand-in writes its result as allreduce.py does: into its last
	// argument, through a renamed temporary file.
	const write = "import os, sys\nopen(sys.argv[-1] + '.tmp', 'w').write('" + result + "')\nos.replace(sys.argv[-1] + '.tmp', sys.argv[-1])\n"
	for _, tc := range []struct {
		name, script string
		min          float64
		wantOut      string
		wantWhy      string
		wantCmd      bool
		wantStderr   string
	}{
		{name: "measured", script: `print("warm-up")` + "\n" + write, wantOut: result, wantCmd: true},
		{name: "failed", script: `import sys; print("no torch", file=sys.stderr); sys.exit(1)`, wantWhy: "printed no result: no torch", wantCmd: true},
		{name: "required and met", script: write, min: 4, wantOut: result, wantCmd: true},
		{name: "required, below", script: write, min: 25, wantOut: result,
			wantStderr: "the link measured 4.500 Gbit/s, below the declared 25 Gbit/s (--require-bandwidth): the command does not start"},
		{name: "required, not measured", script: `import sys; sys.exit(1)`, min: 25, wantWhy: "printed no result: its stderr is empty",
			wantStderr: "the link was not measured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := filepath.Join(t.TempDir(), "attempt-1")
			var calls int
			var gotOut, gotWhy string
			step := &executor.LinkStep{Python: py, Script: tc.script, Args: []string{"1", "2"}, MinGbps: tc.min, DeclaredGbps: tc.min,
				Measured: func(out []byte, why error) (string, error) {
					calls++
					gotOut = strings.TrimSpace(string(out))
					if why != nil {
						gotWhy = why.Error()
					}
					return "noted", errors.New("from Measured")
				}}
			var note string
			w := executor.NewLinkWatch(step, base, func(s string) { note = s })
			if w.Poll() {
				t.Fatal("Poll before the step ran: true")
			}
			cmd := exec.Command("/bin/sh", "-c", step.Shell(base, quote)+"echo COMMAND\n")
			b, err := cmd.CombinedOutput()
			ranCmd := strings.Contains(string(b), "COMMAND")
			if ranCmd != tc.wantCmd || (err != nil) == tc.wantCmd || !strings.Contains(string(b), tc.wantStderr) {
				t.Errorf("the script: %v, output %q; want the command run %v, %q", err, b, tc.wantCmd, tc.wantStderr)
			}
			if !tc.wantCmd {
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
					t.Errorf("the script ended with %v, want status 3", err)
				}
			}
			w.Poll()
			merr := w.Finish("COMPLETED")
			if calls != 1 || note != "noted" || merr == nil {
				t.Errorf("Measured called %d time(s), Finish %q %v; want once, its note and error", calls, note, merr)
			}
			if !strings.HasSuffix(gotOut, tc.wantOut) || !strings.Contains(gotWhy, tc.wantWhy) || (tc.wantWhy == "") != (gotWhy == "") {
				t.Errorf("Measured heard %q, why %q; want %q, why %q", gotOut, gotWhy, tc.wantOut, tc.wantWhy)
			}
		})
	}
	t.Run("the job ended before the step", func(t *testing.T) {
		t.Parallel()
		var why error
		w := executor.NewLinkWatch(&executor.LinkStep{Measured: func(_ []byte, e error) (string, error) { why = e; return "", nil }}, filepath.Join(t.TempDir(), "a"), nil)
		_ = w.Finish("CANCELLED by 0")
		if why == nil || !strings.Contains(why.Error(), "ended (CANCELLED by 0) before its link step had a result") {
			t.Errorf("why %v", why)
		}
	})
}

// TestLinkStepPort: a step with a port of its own meets there, not at
// the command's MASTER_PORT, which the command still gets.
func TestLinkStepPort(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	base := filepath.Join(t.TempDir(), "attempt-1")
	step := &executor.LinkStep{Python: py, Port: 29518,
		Script: "import os, sys\nopen(sys.argv[-1], 'w').write(os.environ['MASTER_PORT'])\n"}
	cmd := exec.Command("/bin/sh", "-c", step.Shell(base, executor.ShellQuote)+`echo "command at $MASTER_PORT"`+"\n")
	cmd.Env = []string{"MASTER_PORT=29517"}
	b, err := cmd.CombinedOutput()
	got, _ := os.ReadFile(executor.LinkResultFile(base))
	if err != nil || string(got) != "29518" || strings.TrimSpace(string(b)) != "command at 29517" {
		t.Errorf("the step met at %q, the command said %q (%v); want 29518 and 29517", got, b, err)
	}
}

// TestLinkWatchRefusesLinks: the step's file is in a dir the job writes;
// a link there is not followed, so no other file the agent can read
// reaches the run's report as the step's output.
func TestLinkWatchRefusesLinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	secret := filepath.Join(dir, "agent-only")
	if err := os.WriteFile(secret, []byte(`{"busbw_gbps": 1e9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "attempt-1")
	if err := os.Symlink(secret, executor.LinkResultFile(base)); err != nil {
		t.Fatal(err)
	}
	var heard []byte
	var why error
	w := executor.NewLinkWatch(&executor.LinkStep{Measured: func(b []byte, e error) (string, error) { heard, why = b, e; return "", nil }}, base, nil)
	if w.Poll() {
		t.Error("Poll took a link for the step's result")
	}
	_ = w.Finish("COMPLETED")
	if len(heard) != 0 || why == nil {
		t.Errorf("Measured heard %q, why %v; want nothing, and why", heard, why)
	}
}

// TestLinkWatchOwner: with the job's own user set (a Slurm job run as
// the agent's run-as user), the step's file is read only when it is
// that user's: a file of another user (a hard link to one the job
// could not read itself) is not the step's result.
func TestLinkWatchOwner(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		owner *executor.RunAs
		read  bool
	}{
		{"the job's user's file", &executor.RunAs{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}, true},
		{"another user's file", &executor.RunAs{UID: uint32(os.Getuid()) + 1, GID: uint32(os.Getgid())}, false},
		{"no job user of its own", nil, true},
	} {
		base := filepath.Join(t.TempDir(), "attempt-1")
		if err := os.WriteFile(executor.LinkResultFile(base), []byte(`{"busbw_gbps": 4.5}`), 0o600); err != nil {
			t.Fatal(err)
		}
		var heard []byte
		w := executor.NewLinkWatch(&executor.LinkStep{Measured: func(b []byte, e error) (string, error) { heard = b; return "", nil }}, base, nil)
		w.Owner = tc.owner
		if got := w.Poll(); got != tc.read || (len(heard) > 0) != tc.read {
			t.Errorf("%s: Poll %v, heard %q; want read %v", tc.name, got, heard, tc.read)
		}
	}
}

// TestLinkStepInCommandArgv: which commands take the measurement in
// their own Python, and what they then run.
func TestLinkStepInCommandArgv(t *testing.T) {
	t.Parallel()
	step := &executor.LinkStep{Python: "/usr/bin/python3", Script: "MEASURE", Args: []string{"33554432", "5", "120"}}
	for _, tc := range []struct {
		argv        []string
		interpreter []string // what comes before -c: the interpreter and its flags
		target      []string // what comes after --
	}{
		{[]string{"python3", "train.py", "--steps", "5"}, []string{"python3"}, []string{"train.py", "--steps", "5"}},
		{[]string{"/venv/bin/python", "-u", "-B", "t.py"}, []string{"/venv/bin/python", "-u", "-B"}, []string{"t.py"}},
		{[]string{"python3.11", "-uI", "-m", "torch.distributed.run", "--nnodes", "2", "t.py"}, []string{"python3.11", "-uI"},
			[]string{"-m", "torch.distributed.run", "--nnodes", "2", "t.py"}},
		{[]string{"python3", "-c", "import torch"}, nil, nil},
		{[]string{"python3", "-W", "ignore", "t.py"}, nil, nil},
		{[]string{"python3", "-X", "dev", "t.py"}, nil, nil},
		{[]string{"python3", "-x", "t.py"}, nil, nil},
		{[]string{"python3", "-m"}, nil, nil},
		{[]string{"python3", "-m", "-u"}, nil, nil},
		{[]string{"python3", "run.sh"}, nil, nil},
		{[]string{"python3", "-"}, nil, nil},
		{[]string{"python3"}, nil, nil},
		{[]string{"torchrun", "--nnodes", "2", "t.py"}, nil, nil},
		{[]string{"bash", "train.sh"}, nil, nil},
		{[]string{"ipython", "t.py"}, nil, nil},
		{[]string{"python3-config", "t.py"}, nil, nil},
	} {
		got, ok := step.InCommand("/w/attempt-1", tc.argv)
		if ok != (tc.interpreter != nil) {
			t.Errorf("%q: taken %v, want %v", tc.argv, ok, tc.interpreter != nil)
			continue
		}
		if !ok {
			continue
		}
		n := len(tc.interpreter)
		want := append(append(append([]string{}, tc.interpreter...), "-c"), got[n+1], "MEASURE", "/w/attempt-1.link", "", "33554432", "5", "120", "--")
		want = append(want, tc.target...)
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") || !strings.Contains(got[n+1], "runpy") {
			t.Errorf("%q: ran %q, want %q with the boot script", tc.argv, got, want)
		}
	}
	required := *step
	required.MinGbps = 25
	if _, ok := required.InCommand("/w/a", []string{"python3", "t.py"}); ok {
		t.Error("a required figure was left to the command's Python: it must be checked before the command starts")
	}
	withPort := *step
	withPort.Port = 29518
	if got, _ := withPort.InCommand("/w/a", []string{"python3", "t.py"}); len(got) < 6 || got[5] != "29518" {
		t.Errorf("the step's own port: %q", got)
	}
}

// TestLinkStepInCommand runs a command through InCommand with a stand-in
// torch (a torch.py beside the script) and a stand-in measurement: the
// script runs as `python3 SCRIPT` would (argv, path, __main__, its exit
// status, its output once), the measurement runs once the script's own
// import of torch has finished (a variable the script set before it is
// seen), in another process without the script's signal handlers, with
// the command waiting for it, and its result reaches Measured; a command
// that never imports torch says so.
func TestLinkStepInCommand(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	files := map[string]string{
		// torch's stand-in: slow to import, done only at its end.
		"torch.py": "import time\ntime.sleep(0.2)\ndone = True\n",
		"train.py": `import os, signal, sys
signal.signal(signal.SIGTERM, lambda *a: print("the script's handler"))
print("before", end="")
os.environ["SET_BY_SCRIPT"] = "1"
import torch
measured = open(sys.argv[1] + ".link").read()
print(" after: argv=%s path0=%s name=%s pid=%d result=%s" % (sys.argv[1:], sys.path[0], __name__, os.getpid(), measured))
sys.exit(7)
`,
		"quiet.py": "print('no torch here')\n",
		// A child forked before the script's own import imports torch
		// and exits through its exit handlers: only the command's own
		// process measures, once.
		"forks.py": `import os, sys
pid = os.fork()
if pid == 0:
    import torch
    sys.exit(0)
os.waitpid(pid, 0)
import torch
print("parent done")
`,
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The stand-in measurement: what the forked process saw, as its
	// result, written as allreduce.py writes it, a moment after.
	const measure = `import json, os, signal, sys, time
time.sleep(0.3)
t = sys.modules.get("torch")
print("to the step's stderr", file=sys.stderr)
r = json.dumps({"torch_done": getattr(t, "done", False), "env": os.environ.get("SET_BY_SCRIPT"), "pid": os.getpid(),
    "in_command": GPUPASS_IN_COMMAND, "args": sys.argv[1:4], "port": os.environ.get("MASTER_PORT"),
    "handler": signal.getsignal(signal.SIGTERM) != signal.SIG_DFL})
open(sys.argv[-1] + ".count", "a").write("measured\n")
open(sys.argv[-1] + ".tmp", "w").write(r)
os.replace(sys.argv[-1] + ".tmp", sys.argv[-1])
`
	type ran struct {
		out, stderr, heard, base string
		err, why                 error
	}
	run := func(t *testing.T, script string) ran {
		base := filepath.Join(t.TempDir(), "attempt-1")
		var heard string
		var why error
		step := &executor.LinkStep{Python: "/nonexistent", Script: measure, Args: []string{"1", "2", "3"}, Port: 29518,
			Measured: func(out []byte, e error) (string, error) { heard, why = string(out), e; return "", nil }}
		argv, ok := step.InCommand(base, []string{py, "-u", script, base})
		if !ok {
			t.Fatal("not taken")
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "MASTER_PORT=29517")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		_ = executor.NewLinkWatch(step, base, nil).Finish("COMPLETED")
		return ran{out: stdout.String(), stderr: stderr.String(), heard: heard, base: base, err: err, why: why}
	}
	t.Run("imports torch", func(t *testing.T) {
		t.Parallel()
		r := run(t, "train.py")
		out, stderr, err, heard, why := r.out, r.stderr, r.err, r.heard, r.why
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
			t.Errorf("the command ended %v, want its own status 7 (stderr %q)", err, stderr)
		}
		for _, want := range []string{"path0=" + dir, "name=__main__", `"torch_done": true`, `"env": "1"`, `"in_command": true`, `"args": ["1", "2", "3"]`, `"port": "29518"`, `"handler": false`} {
			if !strings.Contains(out, want) {
				t.Errorf("the command printed %q, want %q in it", out, want)
			}
		}
		if strings.Count(out, "before") != 1 || !strings.HasPrefix(out, "before after: argv=['") {
			t.Errorf("the command printed %q: its output before the fork once, then the rest", out)
		}
		if pid := fieldAfter(out, "pid="); pid == "" || strings.Contains(heard, `"pid": `+pid+",") {
			t.Errorf("the measurement ran in the command's own process (pid %s): %s", pid, heard)
		}
		if why != nil || !strings.Contains(heard, `"torch_done": true`) {
			t.Errorf("Measured heard %q, why %v", heard, why)
		}
		if strings.Contains(stderr, "to the step's stderr") {
			t.Errorf("the measurement's stderr reached the command's: %q", stderr)
		}
	})
	t.Run("forks before its import", func(t *testing.T) {
		t.Parallel()
		r := run(t, "forks.py")
		out, stderr, err, heard, why, base := r.out, r.stderr, r.err, r.heard, r.why, r.base
		count, _ := os.ReadFile(executor.LinkResultFile(base) + ".count")
		if err != nil || strings.TrimSpace(out) != "parent done" || why != nil || !strings.Contains(heard, `"torch_done": true`) || string(count) != "measured\n" {
			t.Errorf("the command: %v, %q %q; Measured heard %q, why %v; measurements %q, want one", err, out, stderr, heard, why, count)
		}
	})
	t.Run("never imports torch", func(t *testing.T) {
		t.Parallel()
		r := run(t, "quiet.py")
		out, err, heard, why := r.out, r.err, r.heard, r.why
		if err != nil || strings.TrimSpace(out) != "no torch here" {
			t.Errorf("the command: %v, %q", err, out)
		}
		if heard != "" || why == nil || !strings.Contains(why.Error(), "the command ended without importing torch") {
			t.Errorf("Measured heard %q, why %v", heard, why)
		}
	})
}

func fieldAfter(s, key string) string {
	_, rest, ok := strings.Cut(s, key)
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, " \n"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}
