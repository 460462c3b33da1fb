package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"
)

// MetricMarker prefixes a metric line in a process's standard output:
//
//	gpupass:metric {"step":10,"loss":1.93,"ts":"2026-01-02T03:04:05Z"}
const MetricMarker = "gpupass:metric"

// Metric is one metric point of a run: the step, its scalars (loss and any
// other) and when it was logged.
type Metric struct {
	// Seq is the per-run sequence number shared with events.
	Seq  uint64    `json:"seq,omitempty"`
	Step int64     `json:"step"`
	Time time.Time `json:"ts"`
	// Attempt counts process starts of the run from 1; a NaN restart
	// starts attempt 2. A step logged by a later attempt supersedes the
	// same step of an earlier one (see Continuous).
	Attempt int                `json:"attempt"`
	Values  map[string]float64 `json:"values"`
	// Source is "file" ($GPUPASS_METRICS_FILE) or "stdout".
	Source string `json:"source,omitempty"`
}

// Loss returns the "loss" scalar.
func (m Metric) Loss() (float64, bool) {
	v, ok := m.Values["loss"]
	return v, ok
}

// metricJSON carries non-finite values, which encoding/json refuses, as
// the strings "NaN", "Infinity" and "-Infinity".
type metricJSON struct {
	Seq     uint64         `json:"seq,omitempty"`
	Step    int64          `json:"step"`
	Time    string         `json:"ts"`
	Attempt int            `json:"attempt"`
	Values  map[string]any `json:"values"`
	Source  string         `json:"source,omitempty"`
}

// MarshalJSON writes non-finite values as "NaN", "Infinity", "-Infinity".
func (m Metric) MarshalJSON() ([]byte, error) {
	vals := make(map[string]any, len(m.Values))
	for k, v := range m.Values {
		switch {
		case math.IsNaN(v):
			vals[k] = "NaN"
		case math.IsInf(v, 1):
			vals[k] = "Infinity"
		case math.IsInf(v, -1):
			vals[k] = "-Infinity"
		default:
			vals[k] = v
		}
	}
	return json.Marshal(metricJSON{m.Seq, m.Step, m.Time.UTC().Format(JSONTimeLayout), m.Attempt, vals, m.Source})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *Metric) UnmarshalJSON(b []byte) error {
	var j metricJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339Nano, j.Time)
	if err != nil {
		return fmt.Errorf("metric ts: %w", err)
	}
	vals := make(map[string]float64, len(j.Values))
	for k, v := range j.Values {
		f, ok := scalar(v)
		if !ok {
			return fmt.Errorf("metric value %q is not a number", k)
		}
		vals[k] = f
	}
	*m = Metric{Seq: j.Seq, Step: j.Step, Time: t.UTC(), Attempt: j.Attempt, Values: vals, Source: j.Source}
	return nil
}

func scalar(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case string:
		switch x {
		case "NaN":
			return math.NaN(), true
		case "Infinity", "+Infinity", "inf":
			return math.Inf(1), true
		case "-Infinity", "-inf":
			return math.Inf(-1), true
		}
	}
	return 0, false
}

// ErrNoStep says a metric line has no integer "step".
var ErrNoStep = errors.New(`no integer "step"`)

// MaxStep bounds steps (2^53, exact in a float64) so that step
// arithmetic in alignment and charts cannot overflow. internal/metrics
// uses it too: a step the compare report would drop is refused here,
// where the job can be told.
const MaxStep = 1 << 53

// timeKeys name a line's time, the first that parses winning; a fixed
// order because the decoded map's iteration order is random.
var timeKeys = []string{"ts", "time", "timestamp"}

// ParseMetric reads one metric line as the job writes it to
// $GPUPASS_METRICS_FILE (or after MetricMarker on stdout): a flat JSON
// object with an integer "step", numeric scalars and an optional time
// ("ts", "time" or "timestamp", the first usable in that order: RFC 3339,
// or epoch seconds; steps are bounded by ±2^53). Python's
// json module writes non-finite floats as bare NaN, Infinity and
// -Infinity tokens, which are accepted. Strings, booleans, nulls and
// nested values other than the time are ignored. now is used when the
// line carries no time.
//
// The compare branch's internal/metrics reader extracts one named metric
// from whole files; the agent needs every scalar of one line at a time,
// hence this small parser.
func ParseMetric(line []byte, now time.Time) (Metric, error) {
	line = bytes.TrimSpace(line)
	if i := bytes.Index(line, []byte(MetricMarker)); i >= 0 {
		line = bytes.TrimSpace(line[i+len(MetricMarker):])
	}
	if len(line) == 0 || line[0] != '{' {
		return Metric{}, errors.New("not a JSON object")
	}
	var raw map[string]any
	dec := json.NewDecoder(bytes.NewReader(quoteNonFinite(line)))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Metric{}, fmt.Errorf("not a JSON object: %w", err)
	}
	m := Metric{Time: now.UTC(), Values: map[string]float64{}}
	hasStep := false
	for k, v := range raw {
		switch k {
		case "step":
			n, ok := v.(json.Number)
			if !ok {
				return Metric{}, ErrNoStep
			}
			s, err := strconv.ParseInt(string(n), 10, 64)
			if err != nil {
				f, ferr := n.Float64()
				if ferr != nil || f != math.Trunc(f) {
					return Metric{}, ErrNoStep
				}
				if math.Abs(f) > MaxStep {
					return Metric{}, fmt.Errorf("%w: %s out of range (|step| ≤ 2^53)", ErrNoStep, n)
				}
				s = int64(f)
			}
			if s > MaxStep || s < -MaxStep {
				return Metric{}, fmt.Errorf("%w: %s out of range (|step| ≤ 2^53)", ErrNoStep, n)
			}
			m.Step, hasStep = s, true
			continue
		case "ts", "time", "timestamp":
			continue // below, in a fixed order
		}
		switch x := v.(type) {
		case json.Number:
			if f, err := x.Float64(); err == nil {
				m.Values[k] = f
			}
		case string:
			// Only the non-finite tokens quoteNonFinite made strings.
			if f, ok := scalar(x); ok {
				m.Values[k] = f
			}
		}
	}
	if !hasStep {
		return Metric{}, ErrNoStep
	}
	for _, k := range timeKeys {
		if t, ok := parseTime(raw[k]); ok {
			m.Time = t
			break
		}
	}
	return m, nil
}

// InNanoRange says whether t is a time whose Unix nanoseconds an int64
// holds (years 1678 to 2262), as the broker and internal/metrics keep
// times; UnixNano is undefined outside.
func InNanoRange(t time.Time) bool { return !t.Before(minTime) && !t.After(maxTime) }

var minTime, maxTime = time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)

func parseTime(v any) (time.Time, bool) {
	switch x := v.(type) {
	case string:
		t, err := time.Parse(time.RFC3339Nano, x)
		if err != nil || !InNanoRange(t) {
			return time.Time{}, false
		}
		return t.UTC(), true
	case json.Number:
		f, err := x.Float64()
		// Seconds whose nanoseconds an int64 holds (to 2262), as
		// internal/metrics reads them; the negated form rejects NaN.
		if err != nil || !(f >= 0 && f*1e9 < float64(math.MaxInt64)) {
			return time.Time{}, false
		}
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(frac*1e9)).UTC(), true
	}
	return time.Time{}, false
}

// quoteNonFinite wraps the bare NaN, Infinity and -Infinity tokens that
// Python writes outside strings in quotes, so encoding/json reads them.
func quoteNonFinite(b []byte) []byte {
	if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	inStr, esc := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inStr {
			out = append(out, c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		if c == '"' {
			inStr = true
			out = append(out, c)
			continue
		}
		if tok := nonFiniteAt(b[i:]); tok != "" {
			out = append(out, '"')
			out = append(out, tok...)
			out = append(out, '"')
			i += len(tok) - 1
			continue
		}
		out = append(out, c)
	}
	return out
}

// Continuous turns the metric points of a run, in sequence order, into
// one series: a step logged again by a later attempt (after a NaN restart
// from a checkpoint) supersedes what earlier attempts logged for it, and
// the result is sorted by step. Points of a failed attempt past the step
// its successor resumed from are thereby replaced as the successor
// reaches them; this is the same "last logged value of a step wins" rule
// the compare report applies to files.
func Continuous(points []Metric) []Metric {
	byStep := make(map[int64]int, len(points))
	out := make([]Metric, 0, len(points))
	for _, p := range points {
		if i, ok := byStep[p.Step]; ok {
			if p.Attempt >= out[i].Attempt {
				out[i] = p
			}
			continue
		}
		byStep[p.Step] = len(out)
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out
}

func nonFiniteAt(b []byte) string {
	for _, tok := range []string{"-Infinity", "Infinity", "NaN"} {
		if bytes.HasPrefix(b, []byte(tok)) {
			return tok
		}
	}
	return ""
}
