package metrics

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/gpupass/gpupass/internal/events"
)

// LogMarker prefixes metric lines inside a training log:
//
//	gpupass:metric {"step":10,"loss":1.93,"ts":"2026-01-02T03:04:05Z"}
const LogMarker = "gpupass:metric"

// errNotJSON is the problem of a line that is not JSON at all.
const errNotJSON = "not a JSON object"

// Options choose what a reader extracts.
type Options struct {
	// Metric is the key, CSV column or TensorBoard tag to read. Empty
	// picks the loss: "loss" in JSONL, the first training-loss column or
	// tag otherwise.
	Metric string
	// Pattern, when set, reads text logs with it instead of the built-in
	// forms (see LineReader).
	Pattern *Pattern
	// SizeHint is the input size in bytes when known; readers use it to
	// size their buffers once.
	SizeHint int64
}

// ReadJSONL reads gpupass JSONL: one flat JSON object a line with "step",
// the metric ("loss" by default) and "ts" (RFC 3339 with any offset, or
// epoch seconds). Lines carrying LogMarker are read after the marker, so
// a whole training log works too; in a log (any marker line seen) other
// lines are ordinary output, not problems. Objects of the form
// {"name":"loss","value":1.2,...} are accepted as well, and
// {"event":"start"|"restart","ts":...} records the run start or a restart.
// NaN and ±Infinity, as Python's json module writes them, are kept.
func ReadJSONL(r io.Reader, source string, opt Options) (*Series, error) {
	metric := opt.Metric
	if metric == "" {
		metric = "loss"
	}
	s := &Series{Source: source, Metric: metric, Format: "jsonl"}
	var plain Problems // non-JSON lines; problems only if no marker line is seen
	markers := 0
	maxAttempt := 0
	var restarts RestartTracker // a restart waits for the next point to place it
	ln := newLines(r)
	marker := []byte(LogMarker)
	for {
		line, where, err := ln.read(source, &s.Problems)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if i := bytes.Index(line, marker); i >= 0 {
			markers++
			line = bytes.TrimSpace(line[i+len(marker):])
		} else if !jsonObject(line) {
			plain.Add(where.String(), errNotJSON)
			continue
		}
		rec, perr := parseFlat(line, metric, false)
		if perr != nil {
			s.Problems.Add(where.String(), perr.Error())
			continue
		}
		switch rec.event {
		case "start":
			if rec.hasTime && s.Start == 0 {
				s.Start = rec.time
			}
			continue
		case "restart":
			s.Restarts++
			restarts.Event()
			continue
		}
		if !rec.hasValue {
			// Other metrics logged on their own line (lr, accuracy) are
			// normal; only a line with a step and nothing usable is odd.
			continue
		}
		if !rec.hasStep {
			s.Problems.Add(where.String(), `no "step"`)
			continue
		}
		if rec.attempt > maxAttempt {
			maxAttempt = rec.attempt
		}
		restarts.Point(s, rec.attempt, rec.step)
		s.Points = append(s.Points, Point{Step: rec.step, Value: rec.value, Time: rec.time})
		if len(s.Points) == sizeSample && opt.SizeHint > 0 {
			s.Points = presize(s.Points, ln.bytes, opt.SizeHint)
		}
	}
	if markers == 0 && plain.Count > 0 {
		// Not a log after all: non-JSON lines are problems, reported in
		// line order with the others.
		merged := append(plain.First, s.Problems.First...)
		sort.SliceStable(merged, func(i, j int) bool { return lineOf(merged[i].Where) < lineOf(merged[j].Where) })
		s.Problems.First = merged[:min(len(merged), MaxReported)]
		s.Problems.Count += plain.Count
	}
	if len(s.Points) == 0 {
		return nil, &EmptyError{Source: source, Metric: metric, Problems: s.Problems}
	}
	if maxAttempt > 1 && s.Restarts == 0 {
		// Attempt n is the n-th process start of the run.
		s.Restarts = maxAttempt - 1
	}
	s.Normalize()
	return s, nil
}

// jsonObject says whether a line looks like a JSON object: `{"` or `{}`,
// not a printed Python dict (`{'loss': 2.3}`), which is a text log line.
func jsonObject(line []byte) bool {
	if len(line) == 0 || line[0] != '{' {
		return false
	}
	rest := bytes.TrimLeft(line[1:], " \t")
	return len(rest) == 0 || rest[0] == '"' || rest[0] == '}'
}

type flatRecord struct {
	step              int64
	value             float64
	time              int64
	event             string
	attempt           int
	hasStep, hasValue bool
	hasTime           bool
}

// parseFlat reads one JSON object by hand: encoding/json costs several
// times more per line, and Python writes NaN/Infinity that it rejects.
// Nested values are skipped, except a top-level "values" object, which is
// read once; inside it (nested) nothing is looked into, so a line costs
// time linear in its length however deep it nests.
func parseFlat(b []byte, metric string, nested bool) (flatRecord, error) {
	var rec flatRecord
	p := &scanner{b: b}
	p.ws()
	if !p.eat('{') {
		return rec, fmt.Errorf("not a JSON object")
	}
	var name string
	var nvValue float64
	var hasNV bool
	p.ws()
	if p.eat('}') {
		return rec, nil
	}
	for {
		p.ws()
		key, err := p.str()
		if err != nil {
			return rec, err
		}
		p.ws()
		if !p.eat(':') {
			return rec, fmt.Errorf("expected ':' after %q at column %d", key, p.i+1)
		}
		p.ws()
		switch string(key) {
		case "step":
			f, ok, err := p.num()
			if err != nil {
				return rec, fmt.Errorf(`"step": %w`, err)
			}
			if !ok || f != math.Trunc(f) || math.IsInf(f, 0) {
				return rec, fmt.Errorf(`"step" is not an integer`)
			}
			if math.Abs(f) > MaxStep {
				return rec, fmt.Errorf(`"step" %g out of range (|step| ≤ 2^53)`, f)
			}
			rec.step, rec.hasStep = int64(f), true
		case metric:
			f, ok, err := p.num()
			if err != nil {
				return rec, fmt.Errorf("%q: %w", metric, err)
			}
			if ok {
				rec.value, rec.hasValue = f, true
			}
		case "value":
			f, ok, err := p.num()
			if err != nil {
				return rec, fmt.Errorf(`"value": %w`, err)
			}
			nvValue, hasNV = f, ok
		case "values":
			// gpupass run metrics (the agent spool and broker export):
			// {"step":..,"ts":..,"attempt":..,"values":{"loss":..}}.
			// Only the top level's: recursing into "values" within
			// "values" would skip, then re-read, every level again.
			if nested || p.peek() != '{' {
				if err := p.skip(); err != nil {
					return rec, err
				}
				break
			}
			start := p.i
			if err := p.skip(); err != nil {
				return rec, err
			}
			inner, err := parseFlat(p.b[start:p.i], metric, true)
			if err != nil {
				return rec, fmt.Errorf(`"values": %w`, err)
			}
			if inner.hasValue {
				rec.value, rec.hasValue = inner.value, true
			}
		case "attempt":
			f, ok, err := p.num()
			if err != nil {
				return rec, fmt.Errorf(`"attempt": %w`, err)
			}
			if ok && f >= 1 && f < 1e9 {
				rec.attempt = int(f)
			}
		case "name", "metric", "event":
			if p.peek() != '"' {
				if err := p.skip(); err != nil {
					return rec, err
				}
				break
			}
			v, err := p.str()
			if err != nil {
				return rec, err
			}
			if string(key) == "event" {
				rec.event = string(v)
			} else {
				name = string(v)
			}
		case "ts", "time", "timestamp", "wall_time":
			t, err := p.timestamp()
			if err != nil {
				return rec, fmt.Errorf("%q: %w", key, err)
			}
			rec.time, rec.hasTime = t, true
		default:
			if err := p.skip(); err != nil {
				return rec, err
			}
		}
		p.ws()
		if p.eat(',') {
			continue
		}
		if p.eat('}') {
			break
		}
		return rec, fmt.Errorf("expected ',' or '}' at column %d", p.i+1)
	}
	p.ws()
	if p.i != len(p.b) {
		return rec, fmt.Errorf("trailing data at column %d", p.i+1)
	}
	if hasNV && name == metric && !rec.hasValue {
		rec.value, rec.hasValue = nvValue, true
	}
	return rec, nil
}

type scanner struct {
	b []byte
	i int
}

func (p *scanner) ws() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\r' || p.b[p.i] == '\n') {
		p.i++
	}
}

func (p *scanner) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *scanner) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a JSON string. Escapes are rare in these files, so only then
// does it go through encoding/json.
func (p *scanner) str() ([]byte, error) {
	if !p.eat('"') {
		return nil, fmt.Errorf("expected a string at column %d", p.i+1)
	}
	start := p.i
	escaped := false
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case '\\':
			escaped = true
			p.i += 2
			continue
		case '"':
			raw := p.b[start:p.i]
			p.i++
			if !escaped {
				return raw, nil
			}
			var s string
			if err := json.Unmarshal(p.b[start-1:p.i], &s); err != nil {
				return nil, fmt.Errorf("bad string at column %d", start)
			}
			return []byte(s), nil
		}
		p.i++
	}
	return nil, fmt.Errorf("unterminated string at column %d", start)
}

// num reads a number, NaN, Infinity, -Infinity, or null (ok=false).
func (p *scanner) num() (float64, bool, error) {
	start := p.i
	if p.hasWord("null") {
		return 0, false, nil
	}
	if p.hasWord("NaN") {
		return math.NaN(), true, nil
	}
	if p.hasWord("Infinity") {
		return math.Inf(1), true, nil
	}
	if p.hasWord("-Infinity") {
		return math.Inf(-1), true, nil
	}
	if p.peek() == '"' {
		// Some loggers quote non-finite values: "NaN", "inf".
		s, err := p.str()
		if err != nil {
			return 0, false, err
		}
		f, err := strconv.ParseFloat(string(s), 64)
		if err != nil {
			return 0, false, fmt.Errorf("not a number: %q", s)
		}
		return f, true, nil
	}
	for p.i < len(p.b) {
		c := p.b[p.i]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			p.i++
			continue
		}
		break
	}
	if p.i == start {
		return 0, false, fmt.Errorf("expected a number at column %d", start+1)
	}
	if f, ok := smallInt(p.b[start:p.i]); ok {
		return f, true, nil
	}
	f, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
	if err != nil {
		return 0, false, fmt.Errorf("bad number %q", p.b[start:p.i])
	}
	return f, true, nil
}

func (p *scanner) hasWord(w string) bool {
	if len(p.b)-p.i >= len(w) && string(p.b[p.i:p.i+len(w)]) == w {
		p.i += len(w)
		return true
	}
	return false
}

// timestamp reads RFC 3339 (any offset, converted to UTC) or epoch
// seconds, and returns Unix nanoseconds.
func (p *scanner) timestamp() (int64, error) {
	if p.peek() == '"' {
		s, err := p.str()
		if err != nil {
			return 0, err
		}
		t, err := time.Parse(time.RFC3339Nano, string(s))
		if err != nil {
			if f, ferr := strconv.ParseFloat(string(s), 64); ferr == nil {
				return epochSeconds(f)
			}
			return 0, fmt.Errorf("%q is neither RFC 3339 (2026-01-02T03:04:05Z, any offset) nor epoch seconds", s)
		}
		if !events.InNanoRange(t) {
			return 0, fmt.Errorf(errTimeRange, s)
		}
		return t.UnixNano(), nil
	}
	f, ok, err := p.num()
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, nil
	}
	return epochSeconds(f)
}

func epochSeconds(f float64) (int64, error) {
	ns, ok := epochNanos(f)
	if !ok {
		return 0, fmt.Errorf("epoch seconds %v out of range", f)
	}
	return ns, nil
}

// epochNanos converts epoch seconds to Unix nanoseconds, which an int64
// holds up to 2262; past that the conversion would wrap to a time in 1677.
func epochNanos(f float64) (int64, bool) {
	ns := math.Round(f * 1e9)
	// float64(math.MaxInt64) is 2^63, the first value that does not fit;
	// the negated form also rejects NaN.
	if !(ns >= 0 && ns < float64(math.MaxInt64)) {
		return 0, false
	}
	return int64(ns), true
}

// errTimeRange says a time is outside events.InNanoRange.
const errTimeRange = "time %q out of range (years 1678 to 2262)"

// skip steps over one JSON value of any kind.
func (p *scanner) skip() error {
	switch c := p.peek(); c {
	case '"':
		_, err := p.str()
		return err
	case '{', '[':
		depth := 0
		for p.i < len(p.b) {
			switch p.b[p.i] {
			case '"':
				if _, err := p.str(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					p.i++
					return nil
				}
			}
			p.i++
		}
		return fmt.Errorf("unterminated %c", c)
	default:
		for _, w := range []string{"true", "false", "null"} {
			if p.hasWord(w) {
				return nil
			}
		}
		_, _, err := p.num()
		return err
	}
}

// lineRef formats a line location lazily: most lines are fine, and
// formatting a string per line costs more than parsing it.
type lineRef int

func (l lineRef) String() string { return "line " + strconv.Itoa(int(l)) }

func lineOf(where string) int {
	n, _ := strconv.Atoi(where[len("line "):])
	return n
}

// smallInt parses plain integers (steps, epoch seconds) without
// strconv.ParseFloat, which is most of the cost of a line.
func smallInt(b []byte) (float64, bool) {
	neg := false
	if len(b) > 0 && b[0] == '-' {
		neg, b = true, b[1:]
	}
	if len(b) == 0 || len(b) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return float64(n), true
}
