package executor

import (
	"os"
	"sync"

	"github.com/gpupass/gpupass/internal/metrics"
)

// SourceText is the Source of a metric point read from a script's own
// log line (`loss 7.89`, `{'loss': 7.89}`, or the spec's
// metrics.pattern), not from a gpupass:metric line or the metrics file.
const SourceText = "text"

// textMetrics reads the loss from the output lines of a job that prints
// it its own way, so an unmodified script's losses are recorded and its
// NaN stops it as a JSONL NaN does. Once the job logs a metric the
// gpupass way (a gpupass:metric line or $GPUPASS_METRICS_FILE) that is
// its series, and text lines are no longer read: the same loss would be
// recorded twice. One per attempt: its steps (a line's `step N`, else
// its epoch and batch position, else the line's order) start again with
// the attempt, and a later attempt's step supersedes an earlier one's.
type textMetrics struct {
	mu  sync.Mutex
	r   *metrics.LineReader
	off bool
	// buf holds the line being read: one buffer, not a copy a line.
	buf []byte
	// fileUsed says whether the job has written its metrics file. The
	// file is polled, so a trainer that writes a step's JSON line and then
	// prints `step 40 loss 0.5` would have that line read first; the
	// file's size, looked at when a line has a loss, decides instead.
	fileUsed func() bool
}

// newTextMetrics reads losses from output lines until the job logs the
// gpupass way, which for the metrics file is its growing past start
// bytes (where this run's metrics begin).
func newTextMetrics(pat *metrics.Pattern, metricsFile string, start int64) *textMetrics {
	return &textMetrics{r: metrics.NewLineReader("", pat), fileUsed: func() bool {
		// Lstat: only the size, never following a link the job made.
		fi, err := os.Lstat(metricsFile)
		return err == nil && fi.Size() > start
	}}
}

// read returns the loss of one output line, stdout and stderr alike
// (Python's logging writes to stderr).
func (t *textMetrics) read(line string) (step int64, loss float64, ok bool) {
	if t == nil {
		return 0, 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off {
		return 0, 0, false
	}
	// A progress bar's updates are one line of carriage returns; the
	// last update says the most.
	for i := len(line) - 1; i >= 0; i-- {
		if line[i] == '\r' && i < len(line)-1 {
			line = line[i+1:]
			break
		}
	}
	t.buf = append(t.buf[:0], line...)
	step, loss, ok, err := t.r.Read(t.buf)
	if ok && err == nil && t.fileUsed != nil && t.fileUsed() {
		t.off = true
		return 0, 0, false
	}
	return step, loss, ok && err == nil
}

// stop turns text reading off: the job logs metrics the gpupass way.
func (t *textMetrics) stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.off = true
	t.mu.Unlock()
}
