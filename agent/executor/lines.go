package executor

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gpupass/gpupass/internal/events"
)

// DefaultMaxLine bounds an output line: a process printing a 100 MB line
// (or binary data with no newline) costs this much memory, not 100 MB.
const DefaultMaxLine = 16 << 10

// ReadLines splits r into lines of at most maxLine bytes and calls emit
// for each. Memory stays bounded by the read buffer plus maxLine whatever
// the input: the part of a longer line past maxLine is counted and dropped
// as it is read.
func ReadLines(r io.Reader, stream events.Stream, maxLine int, emit func(Line)) error {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	buf := make([]byte, 64<<10)
	cur := make([]byte, 0, min(maxLine, 4096))
	cut := 0
	flush := func() {
		emit(MakeLine(stream, cur, cut))
		cur, cut = cur[:0], 0
	}
	for {
		n, err := r.Read(buf)
		chunk := buf[:n]
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			part := chunk
			if i >= 0 {
				part = chunk[:i]
			}
			if room := maxLine - len(cur); len(part) > room {
				cur = append(cur, part[:room]...)
				cut += len(part) - room
			} else {
				cur = append(cur, part...)
			}
			if i < 0 {
				break
			}
			flush()
			chunk = chunk[i+1:]
		}
		if err != nil {
			if len(cur) > 0 || cut > 0 {
				flush()
			}
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// MakeLine is the line b of stream, cut bytes already dropped from its
// end: a trailing \r is dropped, a cut that split a character backs off to
// the last whole one, and bytes that are not UTF-8 are replaced (and said
// so). Runners that read output files make their lines with it too. The
// Line holds a copy: callers may reuse b (the follower does).
func MakeLine(stream events.Stream, b []byte, cut int) Line {
	b = bytes.TrimSuffix(b, []byte("\r"))
	if cut > 0 {
		// Do not let the cut itself split a character and look like bad
		// input: back off to the start of the last whole rune.
		for k := 1; k < utf8.UTFMax && k <= len(b); k++ {
			c := b[len(b)-k]
			if utf8.RuneStart(c) {
				if c >= utf8.RuneSelf && !utf8.FullRune(b[len(b)-k:]) {
					cut += k
					b = b[:len(b)-k]
				}
				break
			}
		}
	}
	l := Line{Stream: stream, Cut: cut}
	if utf8.Valid(b) {
		l.Text = string(b)
	} else {
		l.Text = string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
		l.InvalidUTF8 = true
	}
	return l
}

// OutputLimits bound what one run's output (its stdout and stderr lines)
// may add to its log. They act at the source, so a job printing without
// end fills neither the agent's spool nor the broker's store; the run
// itself goes on (its checkpoints, metrics file and exit status are what
// matter), and WARN/ERROR events say what was dropped. A field of zero
// or less turns that limit off (the agent sets the defaults below).
type OutputLimits struct {
	// LinesPerSecond is how many lines a run may print in one second,
	// stdout and stderr together; the rest of that second's lines are
	// dropped and counted.
	LinesPerSecond int
	// MaxBytes is how many bytes of records (events and metric points as
	// spooled) a run's output may add in all; once reached, the rest of
	// its output is dropped.
	MaxBytes int64
}

// Default output limits: 1000 lines/s is far above what a training loop
// logs and far below a print in a tight loop (the job printed
// 37,000 lines/s); 256 MiB of log is months of a normal run's output.
// The broker's per-run limits (gpupass-broker serve --run-max-*) are set
// above these, so a run limited here is never refused there.
const (
	DefaultLinesPerSecond = 1000
	DefaultMaxLogBytes    = 256 << 20
)

// outputLimiter applies OutputLimits to one run. Lines arrive from the
// stdout and stderr readers at once, so it locks.
type outputLimiter struct {
	mu       sync.Mutex
	perSec   int
	maxBytes int64

	window   time.Time // start of the current one-second window
	inWindow int       // lines admitted in it
	dropped  int       // lines dropped by the rate in it, not yet reported

	bytes     int64
	full      bool
	afterFull int // lines dropped since the log limit was reached
}

// newOutputLimiter returns nil (every line recorded) when l sets no limit.
func newOutputLimiter(l OutputLimits) *outputLimiter {
	if l.LinesPerSecond <= 0 && l.MaxBytes <= 0 {
		return nil
	}
	return &outputLimiter{perSec: l.LinesPerSecond, maxBytes: l.MaxBytes}
}

// notice is an event the limiter asks to be recorded.
type notice struct {
	level  events.Level
	msg    string
	fields map[string]string
}

// admit counts one line against the rate. It returns whether to record
// the line and, when a window with dropped lines has just ended, the
// warning that says how many.
func (o *outputLimiter) admit(now time.Time) (bool, *notice) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.full {
		o.afterFull++
		return false, nil
	}
	if o.perSec <= 0 {
		return true, nil
	}
	var n *notice
	if now.Sub(o.window) >= time.Second {
		n = o.rateNotice()
		o.window, o.inWindow = now, 0
	}
	if o.inWindow >= o.perSec {
		o.dropped++
		return false, n
	}
	o.inWindow++
	return true, n
}

func (o *outputLimiter) rateNotice() *notice {
	if o.dropped == 0 {
		return nil
	}
	n := &notice{events.Warn, fmt.Sprintf("run printed more than %d lines/s; %d lines dropped", o.perSec, o.dropped),
		map[string]string{"limit": "lines_per_second", "dropped_lines": strconv.Itoa(o.dropped)}}
	o.dropped = 0
	return n
}

// charge counts size bytes of records made from one admitted line. It
// returns false, with the error that says so, when they would take the
// run past its log limit: that line and all output after it are dropped.
func (o *outputLimiter) charge(size int) (bool, *notice) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.full {
		o.afterFull++
		return false, nil
	}
	if o.maxBytes <= 0 || o.bytes+int64(size) <= o.maxBytes {
		o.bytes += int64(size)
		return true, nil
	}
	o.full, o.afterFull = true, 1
	return false, &notice{events.Error, fmt.Sprintf("run reached its log limit of %s: further output dropped (the run goes on)", mib(o.maxBytes)),
		map[string]string{"limit": "log_bytes", "max_bytes": strconv.FormatInt(o.maxBytes, 10)}}
}

// finish returns what is left to say as the run ends.
func (o *outputLimiter) finish() []notice {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []notice
	if n := o.rateNotice(); n != nil {
		out = append(out, *n)
	}
	if o.full {
		out = append(out, notice{events.Error, fmt.Sprintf("%d lines printed after the log limit of %s were dropped", o.afterFull, mib(o.maxBytes)),
			map[string]string{"limit": "log_bytes", "dropped_lines": strconv.Itoa(o.afterFull)}})
	}
	return out
}

func mib(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
