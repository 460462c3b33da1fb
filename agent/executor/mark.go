package executor

import (
	"encoding/json"
	"fmt"

	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/events"
)

// Mark is how far a run's records reach into the files its attempt
// writes, stored with the records in one step (spool.AppendMarked): the
// attempt in progress, where the lines of its output files that the
// spool holds end, and where the metric points of the metrics file end.
// An agent restarted under a run whose attempt outlived it (a batch job)
// reads the mark back and follows the attempt on from exactly there
// (Job.Reattach), so that no line or point is lost or recorded twice.
type Mark struct {
	Attempt  int `json:"attempt"`
	Restarts int `json:"restarts"`
	// Resume is the checkpoint the attempt started from.
	Resume string `json:"resume,omitempty"`
	// Stdout and Stderr are byte offsets in the attempt's output files.
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
	// Metrics is the byte offset in $GPUPASS_METRICS_FILE, which all
	// attempts share.
	Metrics int64 `json:"metrics"`
	// Deadline is when the run's time limit is reached (Unix ns; 0: no
	// limit): a run followed on after an agent restart keeps it rather
	// than starting the limit afresh.
	Deadline int64 `json:"deadline,omitempty"`
}

// MarkedAppender is an Appender that keeps a mark with its records (the
// run's *spool.Spool, or an uploader in front of it).
type MarkedAppender interface {
	Appender
	AppendMarked(mark []byte, recs ...spool.Record) (first, last uint64, err error)
}

// ReadMark decodes a spool's mark; ok is false when it has none (the run
// never started an attempt that was marked).
func ReadMark(b []byte) (m Mark, ok bool, err error) {
	if len(b) == 0 {
		return Mark{}, false, nil
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return Mark{}, false, fmt.Errorf("reading the spool's mark: %w", err)
	}
	return m, m.Attempt > 0, nil
}

// Position kinds of an item: which offset of the mark its records move.
const (
	posNone = iota
	posStdout
	posStderr
	posMetrics
)

// item is what the recorder queues: a record, and where it moves the
// mark. pre, when set, goes in the same batch just before rec (a metric
// line's point and its event are both stored, or neither).
type item struct {
	pre   *spool.Record
	rec   spool.Record
	pos   int8
	off   int64
	start *Mark
}

func (m *Mark) apply(it *item) {
	switch {
	case it.start != nil:
		metrics := m.Metrics
		*m = *it.start
		m.Metrics = metrics
	case it.pos == posStdout:
		m.Stdout = it.off
	case it.pos == posStderr:
		m.Stderr = it.off
	case it.pos == posMetrics:
		m.Metrics = it.off
	}
}

func linePos(s events.Stream) int8 {
	if s == events.Stderr {
		return posStderr
	}
	return posStdout
}
