package executor

import (
	_ "embed"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// LinkStep is a gang rank's link measurement run as a step of the rank's
// own job, on its node, before the command: the runners whose ranks run
// away from the agent (a Slurm job's task, a Kubernetes pod) take it,
// since an all-reduce from the agent's host would measure the wrong
// network. The agent says what to run and hears the result; the step
// and its file are the runner's.
type LinkStep struct {
	// Python is the node's interpreter, started isolated (-I): the
	// measurement runs nothing the job or its bundle brought.
	Python string
	// Script is the measurement (agent/allreduce.py) and Args its
	// arguments; the step gives it one more, the file to write its
	// result into (one JSON line, written to FILE.tmp and renamed)
	// before it waits for the other ranks to have written theirs.
	Script string
	Args   []string
	// MinGbps, when above 0, is the bus bandwidth below which the step
	// ends the job before the command starts (--require-bandwidth),
	// saying both figures; a step that measured nothing ends it too.
	MinGbps float64
	// DeclaredGbps is the spec's figure, named in that message.
	DeclaredGbps float64
	// Port, when above 0, is the rendezvous port of the step in place
	// of the rank's MASTER_PORT: a runner whose rank 0 has the node's
	// ports to itself (a pod's own network namespace) keeps the step's
	// rendezvous apart from the command's, so that a rank whose command
	// starts while rank 0's step still listens cannot join the step's.
	Port int
	// Measured hears the step's standard output, or why the step left
	// none, once (LinkWatch calls it). What it returns is said in the
	// run's log; err, when set, is why the run fails.
	Measured func(stdout []byte, why error) (note string, err error)
}

// LinkResultFile is where a rank's link step leaves its output, beside
// the attempt's other files (base is the attempt's files less their
// extension): the step writes FILE.tmp and renames it, so a file that
// is there is whole.
func LinkResultFile(base string) string { return base + ".link" }

// maxLinkOutput bounds what is read of a step's output: the result is
// one line of about 200 bytes.
const maxLinkOutput = 64 << 10

// Shell is the step as POSIX shell lines for a job's script, run in
// the rank's environment (its rendezvous variables set) before the
// command. A failed measurement lets the command run (it is recorded
// as not measured), unless MinGbps is set: then the job ends with
// status 3 before the command, the figures on its stderr.
func (s *LinkStep) Shell(base string, quote func(string) string) string {
	out := LinkResultFile(base)
	var b strings.Builder
	if s.Port > 0 {
		fmt.Fprintf(&b, "MASTER_PORT=%d ", s.Port)
	}
	fmt.Fprintf(&b, "%s -I -c %s", quote(s.Python), quote(s.Script))
	for _, a := range s.Args {
		b.WriteString(" " + quote(a))
	}
	// The script writes its result into out itself (out.tmp, renamed)
	// and only then waits for every rank at a barrier: no rank's job
	// can end on a shortfall (below) before every rank's result is
	// whole on its node. Written after the process ended, a rank's
	// result could be lost to the job's end on another rank's exit 3.
	// A step that ended with no result leaves the file empty: the
	// agent then reads why from its stderr.
	fmt.Fprintf(&b, " %s >/dev/null 2>%s </dev/null || [ -e %s ] || : >%s\n", quote(out), quote(out+".err"), quote(out), quote(out))
	if s.MinGbps > 0 {
		// The figure is every rank's (the slowest rank's time), so
		// every rank ends here alike.
		fmt.Fprintf(&b, "%s -I -c %s %s %s %s >&2 || exit 3\n", quote(s.Python), quote(linkRequire), quote(out),
			quote(strconv.FormatFloat(s.MinGbps, 'g', -1, 64)), quote(strconv.FormatFloat(s.DeclaredGbps, 'g', -1, 64)))
	}
	return b.String()
}

//go:embed linkboot.py
var linkBoot string

// pythonName is a command that is a Python interpreter: python,
// python3, python3.11, by name (where it lives is the job's PATH's
// business, as for any command).
var pythonName = regexp.MustCompile(`^python(3(\.[0-9]+)?)?$`)

// interpreterFlags are options of python's command line that take no
// argument and mean the same before -c as before a script: -u, -B, -O,
// -OO, -s, -S, -E, -I, -P, -b, -q, alone or together (-uB).
var interpreterFlags = regexp.MustCompile(`^-[uBOsSEIPbq]+$`)

// InCommand is argv, a Python interpreter running a script or a module,
// run with the step in its own interpreter (linkboot.py): the script
// runs as it would, and once its own `import torch` has finished a
// process forked from it measures the link and writes the result where
// Shell's step does (LinkResultFile(base)), the command waiting for it.
// The rank's torch is then imported once, where a step before the
// command imports it a second time (seconds on a node), and the figure
// is that of the torch the command runs with. ok is false where argv is
// anything else (a shell script, torchrun, python -c, -W or -X options)
// and where MinGbps is set: a required figure is checked by Shell's step
// before the command starts at all.
func (s *LinkStep) InCommand(base string, argv []string) (wrapped []string, ok bool) {
	if s.MinGbps > 0 || len(argv) < 2 || !pythonName.MatchString(filepath.Base(argv[0])) {
		return nil, false
	}
	i := 1
	for i < len(argv) && interpreterFlags.MatchString(argv[i]) {
		i++
	}
	target := argv[i:]
	switch {
	case len(target) == 0:
		return nil, false
	case target[0] == "-m":
		if len(target) < 2 || target[1] == "" || strings.HasPrefix(target[1], "-") {
			return nil, false
		}
	case !strings.HasSuffix(target[0], ".py") || strings.HasPrefix(target[0], "-"):
		return nil, false
	}
	port := ""
	if s.Port > 0 {
		port = strconv.Itoa(s.Port)
	}
	wrapped = append(append([]string(nil), argv[:i]...), "-c", linkBoot, s.Script, LinkResultFile(base), port)
	wrapped = append(wrapped, s.linkArgs()...)
	return append(append(wrapped, "--"), target...), true
}

// linkArgs are the measurement's bytes, iterations and timeout, as
// linkboot.py takes them: exactly three.
func (s *LinkStep) linkArgs() []string {
	a := append([]string(nil), s.Args...)
	for len(a) < 3 {
		a = append(a, "")
	}
	return a[:3]
}

// ShellQuote quotes s as one POSIX shell word.
func ShellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// linkRequire fails (status 1) when the step's result is missing or
// below the required figure, saying both.
const linkRequire = `import json, sys
try:
    with open(sys.argv[1]) as f:
        got = json.loads(f.read().strip().splitlines()[-1])["busbw_gbps"]
except Exception as e:
    print("gpupass: the link was not measured (%s), the spec declares %s Gbit/s (--require-bandwidth): the command does not start" % (e, sys.argv[3]))
    sys.exit(1)
if got < float(sys.argv[2]):
    print("gpupass: the link measured %.3f Gbit/s, below the declared %s Gbit/s (--require-bandwidth): the command does not start" % (got, sys.argv[3]))
    sys.exit(1)
`

// LinkWatch hands a rank's link step result to LinkStep.Measured once:
// as soon as the step's file is there (Poll, while the job runs), or
// when the job ended without it (Finish).
type LinkWatch struct {
	// Owner, when set, is the job's own user: the step's files are
	// read only when they are its (RunAs.OpenJobFile).
	Owner *RunAs

	step *LinkStep
	base string
	note func(string)
	once sync.Once
	err  error
}

// NewLinkWatch watches the step of the attempt whose files are base;
// note, when set, hears what Measured said as soon as it said it. It
// is nil (which does nothing) when there is no step.
func NewLinkWatch(step *LinkStep, base string, note func(string)) *LinkWatch {
	if step == nil || step.Measured == nil {
		return nil
	}
	return &LinkWatch{step: step, base: base, note: note}
}

// Poll hands the result over if the step has written it; true once
// it has.
func (w *LinkWatch) Poll() bool {
	if w == nil {
		return true
	}
	b, err := readLimited(LinkResultFile(w.base), w.Owner)
	if err != nil {
		return false
	}
	w.deliver(b, nil)
	return true
}

// Finish hands over the result, or why there is none, once the job
// ended; it returns Measured's error.
func (w *LinkWatch) Finish(jobEnded string) error {
	if w == nil {
		return nil
	}
	if !w.Poll() {
		w.deliver(nil, fmt.Errorf("the gang's job ended (%s) before its link step had a result", jobEnded))
	}
	return w.err
}

func (w *LinkWatch) deliver(b []byte, why error) {
	w.once.Do(func() {
		if why == nil && len(strings.TrimSpace(string(b))) == 0 {
			why = fmt.Errorf("the link step printed no result: %s", lastLineOf(w.base, w.Owner))
		}
		var note string
		note, w.err = w.step.Measured(b, why)
		if note != "" && w.note != nil {
			w.note(note)
		}
	})
}

func lastLineOf(base string, owner *RunAs) string {
	b, err := readLimited(LinkResultFile(base)+".err", owner)
	if err != nil {
		return "its stderr could not be read"
	}
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "its stderr is empty"
	}
	return s
}

// readLimited reads a file the job could have put there itself (the
// step runs as the job, in its dir): a link is not followed, so that the
// agent never reads another file of its own into the run's report, only
// a regular file is read (a FIFO would block the agent), and with owner
// set only one of the job's user's (a hard link to another's is not).
func readLimited(name string, owner *RunAs) ([]byte, error) {
	f, _, err := owner.OpenJobFile(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxLinkOutput))
}
