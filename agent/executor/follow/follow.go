// Package follow reads an attempt's output files as they grow and hands
// their lines over: the files a batch job (Slurm) or a pod (Kubernetes)
// writes in the shared dir, which the agent reads from where it runs. How
// far it read is kept in the attempt's state file, so that an agent
// restarted under the attempt reads on instead of from the start.
//
// It reads files only: finding, watching and stopping the job is the
// runner's. The job only appends to its files (the runners open them so)
// and nothing else writes them, so a file that shrank (truncated,
// rotated) is not read again from its start.
package follow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/fsutil"
)

// maxRead bounds one read of one file: a job that wrote a lot since the
// last poll is handed over in pieces, each poll a piece.
const maxRead = 8 << 20

// Offsets is how far each output file was read and handed over: the end
// of the last line handed over.
type Offsets struct {
	Stdout int64 `json:"stdout_offset"`
	Stderr int64 `json:"stderr_offset"`
}

func (o *Offsets) offsets() *Offsets { return o }

// State is an attempt's state file: a struct that embeds Offsets (its
// fields sit beside the runner's own in the file's JSON object) and holds
// what the runner finds its job again by.
type State interface{ offsets() *Offsets }

// Files follows an attempt's output files, BASE.out (stdout) and
// BASE.err (stderr), keeping its State in BASE.json.
type Files struct {
	paths     [2]string // by events.Stream
	statePath string
	state     State
	// partial is the start (at most maxLine bytes) of the line each file
	// ends with, read but not handed over until its newline (or the final
	// read) comes; pending is that line's whole length so far. A job
	// writing without a newline costs maxLine bytes here, not all it wrote.
	partial [2][]byte
	pending [2]int64
	maxLine int
	out     func(executor.Line)
	// owner, when set, is the job's own user (StartAs): its files are
	// read only when they are its regular files, and no state file is
	// read or written in its dir.
	owner *executor.RunAs
}

// Open returns the follower of BASE.out and BASE.err. State is read from
// BASE.json where an earlier agent process left it; with no file it is
// left as it is. Lines longer than maxLine bytes (0:
// executor.DefaultMaxLine) are cut, as the local executor cuts them.
func Open(base string, state State, maxLine int, out func(executor.Line)) (*Files, error) {
	f := newFiles(base, state, maxLine, out)
	b, err := os.ReadFile(f.statePath)
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err == nil {
		err = json.Unmarshal(b, state)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the attempt's state %s: %w", f.statePath, err)
	}
	return f, nil
}

func (f *Files) open(path string) (*os.File, error) {
	if f.owner == nil {
		return os.Open(path)
	}
	// The dir is the job's: a link there to a file only the agent may
	// read must not put that file into the run's log.
	fh, _, err := f.owner.OpenJobFile(path)
	return fh, err
}

func newFiles(base string, state State, maxLine int, out func(executor.Line)) *Files {
	if maxLine <= 0 {
		maxLine = executor.DefaultMaxLine
	}
	return &Files{paths: [2]string{events.Stdout: base + ".out", events.Stderr: base + ".err"}, statePath: base + ".json",
		state: state, maxLine: maxLine, out: out}
}

// Save writes the state to the state file (not in a dir of the job's
// own user: the agent would write where the job's links point).
func (f *Files) Save() error {
	if f.owner != nil {
		return nil
	}
	b, err := json.Marshal(f.state)
	if err != nil {
		return fmt.Errorf("encoding the attempt's state: %w", err)
	}
	return fsutil.WriteFileAtomic(f.statePath, b, 0o644)
}

// Read hands over the complete lines written since the last read (all of
// it, the last line too, when final) and, when it handed any over, saves
// how far it got; the error is the save's. A file not there yet (the job
// is pending) has nothing to read.
func (f *Files) Read(final bool) error {
	off := f.state.offsets()
	moved := false
	for s, path := range f.paths {
		pos := &off.Stdout
		if events.Stream(s) == events.Stderr {
			pos = &off.Stderr
		}
		fh, err := f.open(path)
		if err != nil {
			continue
		}
		_, _ = fh.Seek(*pos+f.pending[s], io.SeekStart)
		b, _ := io.ReadAll(io.LimitReader(fh, maxRead))
		fh.Close()
		for len(b) > 0 {
			i := bytes.IndexByte(b, '\n')
			part := b
			if i >= 0 {
				part = b[:i]
			}
			if room := f.maxLine + 1 - len(f.partial[s]); room > 0 {
				// One byte past maxLine: a cut line's \r is then not
				// mistaken for its end.
				f.partial[s] = append(f.partial[s], part[:min(room, len(part))]...)
			}
			f.pending[s] += int64(len(part))
			if i < 0 {
				break
			}
			*pos += f.pending[s] + 1
			f.emit(events.Stream(s), *pos)
			b = b[i+1:]
			moved = true
		}
		if final && f.pending[s] > 0 {
			*pos += f.pending[s]
			f.emit(events.Stream(s), *pos)
			moved = true
		}
	}
	if moved {
		return f.Save()
	}
	return nil
}

// emit hands over stream s's pending line, which ends at end, and starts
// the next.
func (f *Files) emit(s events.Stream, end int64) {
	// b is f.partial[s]'s array, which the next line reuses (no
	// allocation per line). That is safe only because the Line handed over
	// owns no part of it: executor.MakeLine copies the bytes into a
	// string. Keep it so if Line ever holds bytes.
	b, n := f.partial[s], f.pending[s]
	f.partial[s], f.pending[s] = f.partial[s][:0], 0
	if int64(len(b)) == n {
		b = bytes.TrimSuffix(b, []byte("\r"))
		n = int64(len(b))
	}
	if len(b) > f.maxLine {
		b = b[:f.maxLine]
	}
	l := executor.MakeLine(s, b, int(n-int64(len(b))))
	l.Offset = end
	f.out(l)
}

// Attempt is one attempt of a run as a runner that follows it from files
// keeps it.
type Attempt struct {
	// AllocID and N (the attempt's number) come from the attempt's
	// environment; a runner names its job after them.
	AllocID, N string
	// Base is the attempt's files less their extension, in its work
	// dir: BASE.out, BASE.err, BASE.json and the runner's own.
	Base  string
	Files *Files
}

// Start reads the attempt's allocation id and number from its
// environment, makes its dir (WORKDIR/SUB) and opens the follower of its
// files there, with state. An attempt followed on after an agent restart
// (a.From) reads on from where the run's spool holds the lines, not from
// the state file's offsets: lines read just before the agent died but
// never stored are handed over again, stored ones are not.
func Start(a executor.Attempt, sub string, state State, out func(executor.Line)) (*Attempt, error) {
	return StartAs(a, sub, nil, state, out)
}

// StartAs is Start for a job that runs as owner (a uid of the run's own):
// WORKDIR/SUB is handed to owner (0700), so that the job, and no other
// run's, can create its output files there; those files are read only
// when they are owner's regular files, and there is no state file (the
// runner finds its job again in its own records, and an agent restarted
// under the attempt reads on from a.From).
func StartAs(a executor.Attempt, sub string, owner *executor.RunAs, state State, out func(executor.Line)) (*Attempt, error) {
	at := &Attempt{AllocID: executor.EnvValue(a.Env, executor.EnvAllocID), N: executor.EnvValue(a.Env, executor.EnvAttempt)}
	if at.AllocID == "" || at.N == "" {
		return nil, errors.New("the attempt's environment has no " + executor.EnvAllocID + " or " + executor.EnvAttempt)
	}
	if _, err := strconv.Atoi(at.N); err != nil {
		return nil, fmt.Errorf("%s=%q is not a number", executor.EnvAttempt, at.N)
	}
	dir := filepath.Join(a.Dir, sub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("making the job's dir: %w", err)
	}
	at.Base = filepath.Join(dir, "attempt-"+at.N)
	var f *Files
	if owner != nil {
		// Lchown: a link the job put there is changed itself, and then
		// refused as not a directory.
		fi, err := os.Lstat(dir)
		if err == nil && !fi.IsDir() {
			err = fmt.Errorf("%s is not a directory (%s)", dir, fi.Mode().Type())
		}
		if err == nil {
			err = os.Lchown(dir, int(owner.UID), int(owner.GID))
		}
		if err == nil {
			err = os.Chmod(dir, 0o700)
		}
		if err != nil {
			return nil, fmt.Errorf("handing the job's dir to %s: %w", owner, err)
		}
		f = newFiles(at.Base, state, a.MaxLine, out)
		f.owner = owner
	} else {
		var err error
		if f, err = Open(at.Base, state, a.MaxLine, out); err != nil {
			return nil, err
		}
	}
	at.Files = f
	if a.From != nil {
		off := state.offsets()
		off.Stdout, off.Stderr = a.From.Stdout, a.From.Stderr
	}
	return at, nil
}
