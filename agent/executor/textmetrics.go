package executor

import (
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
}

func newTextMetrics(pat *metrics.Pattern) *textMetrics {
	return &textMetrics{r: metrics.NewLineReader("", pat)}
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
	step, loss, ok, err := t.r.Read([]byte(line))
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
