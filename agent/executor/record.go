package executor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/events"
)

// recorder turns events and metric points into spool records. One
// goroutine appends them in batches (group commit: one write, and under
// SyncAlways one fsync, for whatever queued up meanwhile). The queue is
// bounded, so a process flooding its output is slowed down to the
// spool's pace instead of growing memory.
type recorder struct {
	sp    Appender
	ch    chan item
	done  chan struct{}
	onErr func(error)
	// limit bounds what the run's output lines add (OutputLimits); nil
	// records every line.
	limit *outputLimiter

	mu   sync.Mutex
	err  error
	last uint64

	// marked, when set, stores mark with every batch (Executor.Marks):
	// where the records reach into the files the attempt writes.
	marked MarkedAppender
	mark   Mark
}

const (
	queueLen = 1024
	maxBatch = 1024
)

// newMarkedRecorder records into sp; with mark set (and sp a
// MarkedAppender) every batch carries the mark from *mark on.
func newMarkedRecorder(sp Appender, mark *Mark, onErr func(error)) *recorder {
	r := &recorder{sp: sp, ch: make(chan item, queueLen), done: make(chan struct{}), onErr: onErr}
	if ma, ok := sp.(MarkedAppender); ok && mark != nil {
		r.marked, r.mark = ma, *mark
	}
	go r.loop()
	return r
}

func (r *recorder) loop() {
	defer close(r.done)
	batch := make([]spool.Record, 0, maxBatch+1)
	for it := range r.ch {
		mark := r.mark
		batch = r.add(batch[:0], &it, &mark)
	fill:
		for len(batch) < maxBatch {
			select {
			case more, ok := <-r.ch:
				if !ok {
					break fill
				}
				batch = r.add(batch, &more, &mark)
			default:
				break fill
			}
		}
		r.mu.Lock()
		failed := r.err != nil
		r.mu.Unlock()
		if failed {
			continue // keep draining so producers never block
		}
		var last uint64
		var err error
		if r.marked != nil {
			b, _ := json.Marshal(mark)
			_, last, err = r.marked.AppendMarked(b, batch...)
			if err == nil {
				r.mark = mark
			}
		} else {
			_, last, err = r.sp.Append(batch...)
		}
		r.mu.Lock()
		if err != nil {
			r.err = err
		} else {
			r.last = last
		}
		r.mu.Unlock()
		if err != nil {
			r.onErr(fmt.Errorf("spooling the run's records: %w", err))
		}
	}
}

func (r *recorder) add(batch []spool.Record, it *item, mark *Mark) []spool.Record {
	if it.pre != nil {
		batch = append(batch, *it.pre)
	}
	if r.marked != nil {
		mark.apply(it)
	}
	if it.rec.Kind == 0 {
		return batch // moves the mark only
	}
	return append(batch, it.rec)
}

func (r *recorder) close() (uint64, error) {
	if r.limit != nil {
		for _, n := range r.limit.finish() {
			r.event(n.level, events.ExecutorComp, n.msg, n.fields)
		}
	}
	close(r.ch)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.err
}

func (r *recorder) put(e events.Event) {
	r.ch <- item{rec: spool.Record{Kind: spool.KindEvent, Data: e.AppendJSON(make([]byte, 0, 96+len(e.Message)))}}
}

// attemptStarts records the event of an attempt's start; from it on the
// mark names that attempt.
func (r *recorder) attemptStarts(e events.Event, m Mark) {
	r.ch <- item{rec: spool.Record{Kind: spool.KindEvent, Data: e.AppendJSON(make([]byte, 0, 96+len(e.Message)))}, start: &m}
}

// eventAt records an event about what ends at off in the file of pos.
func (r *recorder) eventAt(level events.Level, component, msg string, pos int8, off int64) {
	e := events.Event{Time: events.Now(), Level: level, Component: component, Message: msg}
	r.ch <- item{rec: spool.Record{Kind: spool.KindEvent, Data: e.AppendJSON(make([]byte, 0, 96+len(e.Message)))}, pos: pos, off: off}
}

// moved moves the mark past what was read without a record (a line the
// output limits dropped, an empty metrics line): after a restart it is
// not read again.
func (r *recorder) moved(pos int8, off int64) {
	if r.marked != nil && off > 0 {
		r.ch <- item{pos: pos, off: off}
	}
}

func (r *recorder) event(level events.Level, component, msg string, fields map[string]string) {
	r.put(events.Event{Time: events.Now(), Level: level, Component: component, Message: msg, Fields: fields})
}

// metricAt records a point of the metrics file that ends at off.
func (r *recorder) metricAt(m events.Metric, off int64) {
	b, err := json.Marshal(m)
	if err != nil {
		r.event(events.Warn, events.MetricsComp, "unencodable metric point: "+err.Error(), nil)
		r.moved(posMetrics, off)
		return
	}
	r.ch <- item{rec: spool.Record{Kind: spool.KindMetric, Data: b}, pos: posMetrics, off: off}
}

// line records one output line: a `gpupass:metric` line as a metric
// point (and a DEBUG event, so the log still shows every line), anything
// else as a classified event.
func (r *recorder) line(c *events.Classifier, l Line, attempt int, onMetric func(events.Metric), text *textMetrics) {
	now := events.Now()
	if r.limit != nil {
		ok, n := r.limit.admit(time.Now())
		if n != nil {
			r.event(n.level, events.ExecutorComp, n.msg, n.fields)
		}
		if !ok {
			r.moved(linePos(l.Stream), l.Offset)
			return
		}
	}
	var fields map[string]string
	if l.Cut > 0 || l.InvalidUTF8 {
		fields = map[string]string{}
		if l.Cut > 0 {
			fields["cut_bytes"] = strconv.Itoa(l.Cut)
		}
		if l.InvalidUTF8 {
			fields["invalid_utf8"] = "true"
		}
	}
	msg := l.Text
	if l.Cut > 0 {
		msg += fmt.Sprintf(" … [line cut: %d more bytes dropped]", l.Cut)
	}
	// A metric point goes just before its line's event, in one item:
	// the limits charge both, and the mark moves past the line once.
	var point []byte
	var m events.Metric
	var ev events.Event
	marked := strings.HasPrefix(strings.TrimSpace(l.Text), events.MetricMarker) && l.Stream == events.Stdout
	if marked {
		var err error
		lvl := events.Debug
		if m, err = events.ParseMetric([]byte(l.Text), now); err != nil {
			lvl = events.Warn
			msg = "malformed metric line (" + err.Error() + "): " + msg
		} else {
			m.Attempt, m.Source = attempt, "stdout"
			if point, err = json.Marshal(m); err != nil {
				lvl, msg, point = events.Warn, "unencodable metric point ("+err.Error()+"): "+msg, nil
			}
		}
		ev = events.Event{Time: now, Level: lvl, Component: events.MetricsComp, Message: msg, Fields: fields}
	} else {
		if l.Cut == 0 {
			if step, loss, ok := text.read(l.Text); ok {
				m = events.Metric{Step: step, Time: now, Attempt: attempt, Values: map[string]float64{"loss": loss}, Source: SourceText}
				point, _ = json.Marshal(m)
			}
		}
		cl := c.Classify(msg)
		if l.Stream == events.Stderr && cl.Component != events.StderrComponent {
			// The component hides the stream; stdout is the default and
			// goes unsaid, to keep the text form of ordinary lines clean.
			if fields == nil {
				fields = map[string]string{}
			}
			fields["stream"] = events.StderrComponent
		}
		ev = events.Event{Time: now, Level: cl.Level, Component: cl.Component, Message: cl.Message, Fields: fields}
	}
	data := ev.AppendJSON(make([]byte, 0, 96+len(ev.Message)))
	if !r.charge(len(point) + len(data)) {
		r.moved(linePos(l.Stream), l.Offset)
		return
	}
	it := item{rec: spool.Record{Kind: spool.KindEvent, Data: data}, pos: linePos(l.Stream), off: l.Offset}
	if point != nil {
		it.pre = &spool.Record{Kind: spool.KindMetric, Data: point}
	}
	r.ch <- it
	if point != nil {
		if marked {
			text.stop()
		}
		onMetric(m)
	}
}

// charge counts size bytes of one line's records against the run's log
// limit, recording the error the moment the limit is reached.
func (r *recorder) charge(size int) bool {
	if r.limit == nil {
		return true
	}
	ok, n := r.limit.charge(size)
	if n != nil {
		r.event(n.level, events.ExecutorComp, n.msg, n.fields)
	}
	return ok
}

// metricsTail follows $GPUPASS_METRICS_FILE: the job appends JSON lines,
// the tail reads complete lines from where it stopped. The file is shared
// by all attempts of a run, so the offset carries over; an attempt that
// truncates, rewrites or replaces the file instead (open with "w") makes
// the tail read it again from the start.
type metricsTail struct {
	path    string
	rec     *recorder
	maxLine int

	off      int64
	file     os.FileInfo // the file last read, nil before the first read
	seen     []byte      // the last bytes read, those just before off
	partial  []byte
	skipping bool // inside a line over maxLine
	lineNo   int
	// lineEnd is the offset just past the line endLine takes.
	lineEnd int64

	attempt  int
	onMetric func(events.Metric)
	// runAs is the job's user, whose file the metrics file must be
	// (nil: the agent's own); refused says a warning was given.
	runAs   *RunAs
	refused bool
}

func (t *metricsTail) read() {
	f, fi, err := t.runAs.OpenJobFile(t.path)
	if errors.Is(err, fs.ErrNotExist) {
		return // the job may have removed it; nothing to read
	}
	if err != nil {
		// Replaced by a link, a FIFO (which would block the tail) or
		// a directory: said once, not read.
		if !t.refused {
			t.refused = true
			t.rec.event(events.Warn, events.MetricsComp, fmt.Sprintf("%s: %v", EnvMetricsFile, err), nil)
		}
		return
	}
	defer f.Close()
	if how := t.changed(f, fi); how != "" {
		t.rec.event(events.Warn, events.MetricsComp, fmt.Sprintf("%s was %s after %d bytes were read: reading it again from the start", EnvMetricsFile, how, t.off), nil)
		t.off, t.seen, t.partial, t.skipping, t.lineNo = 0, t.seen[:0], t.partial[:0], false, 0
	}
	t.file = fi
	if _, err := f.Seek(t.off, io.SeekStart); err != nil {
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		t.off += int64(n)
		chunk := buf[:n]
		t.remember(chunk)
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				t.add(chunk)
				break
			}
			t.add(chunk[:i])
			t.lineEnd = t.off - int64(len(chunk)) + int64(i) + 1
			t.endLine()
			chunk = chunk[i+1:]
		}
		if err != nil || n == 0 {
			return
		}
	}
}

// seenLen is how many bytes before the offset the tail keeps to notice
// a file rewritten in place past the point it had read.
const seenLen = 64

// changed says how the file differs from the one the tail has read up to
// its offset: "replaced" (another file at the path), "truncated" (shorter
// than the offset) or "rewritten" (the bytes before the offset changed,
// as when a job truncates it and writes more than the tail had read
// before the next poll); "" when it is the same file, appended to.
func (t *metricsTail) changed(f *os.File, fi os.FileInfo) string {
	switch {
	case t.file != nil && !os.SameFile(t.file, fi):
		return "replaced"
	case fi.Size() < t.off:
		return "truncated"
	case len(t.seen) > 0:
		b := make([]byte, len(t.seen))
		if n, _ := f.ReadAt(b, t.off-int64(len(b))); n < len(b) || !bytes.Equal(b, t.seen) {
			return "rewritten"
		}
	}
	return ""
}

func (t *metricsTail) remember(b []byte) {
	if len(b) >= seenLen {
		t.seen = append(t.seen[:0], b[len(b)-seenLen:]...)
		return
	}
	if drop := len(t.seen) + len(b) - seenLen; drop > 0 {
		t.seen = append(t.seen[:0], t.seen[drop:]...)
	}
	t.seen = append(t.seen, b...)
}

func (t *metricsTail) add(b []byte) {
	if t.skipping {
		return
	}
	if len(t.partial)+len(b) > t.maxLine {
		t.skipping = true
		t.partial = t.partial[:0]
		return
	}
	t.partial = append(t.partial, b...)
}

func (t *metricsTail) endLine() {
	t.lineNo++
	where := fmt.Sprintf("%s line %d", EnvMetricsFile, t.lineNo)
	line := bytes.TrimSpace(t.partial)
	skipped := t.skipping
	t.partial, t.skipping = t.partial[:0], false
	switch {
	case skipped:
		t.rec.eventAt(events.Warn, events.MetricsComp, fmt.Sprintf("%s: longer than %d bytes, skipped", where, t.maxLine), posMetrics, t.lineEnd)
		return
	case len(line) == 0:
		t.rec.moved(posMetrics, t.lineEnd)
		return
	}
	m, err := events.ParseMetric(line, events.Now())
	if err != nil {
		t.rec.eventAt(events.Warn, events.MetricsComp, fmt.Sprintf("%s: %v: %s", where, err, truncate(string(bytes.ToValidUTF8(line, []byte("\uFFFD"))), 200)), posMetrics, t.lineEnd)
		return
	}
	m.Attempt, m.Source = t.attempt, "file"
	t.rec.metricAt(m, t.lineEnd)
	t.onMetric(m)
}

// finish takes the unterminated last line an attempt left: a complete
// point (the job's last write had no newline) is recorded, as
// metrics.ReadJSONL reads it from the file too; a fragment (the job was
// killed mid-write) is dropped with a warning. Either way the next
// attempt's lines are not glued to it.
func (t *metricsTail) finish() {
	defer func() { t.partial, t.skipping = t.partial[:0], false }()
	line := bytes.TrimSpace(t.partial)
	if !t.skipping && len(line) == 0 {
		return
	}
	t.lineNo++
	if !t.skipping {
		m, err := events.ParseMetric(line, events.Now())
		if err == nil {
			m.Attempt, m.Source = t.attempt, "file"
			t.rec.metricAt(m, t.off)
			t.onMetric(m)
			return
		}
	}
	t.rec.eventAt(events.Warn, events.MetricsComp, fmt.Sprintf("%s line %d: unterminated when attempt %d ended, skipped", EnvMetricsFile, t.lineNo, t.attempt), posMetrics, t.off)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
