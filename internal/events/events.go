// Package events defines the structured records of a run: the log event
// (per-run sequence number, UTC time with milliseconds, level, component,
// message, fields) and the metric point, their text and JSON forms, the
// classifier that turns a training process's output line into an event,
// and the parser of metric lines.
//
// It is pure: no I/O and no network code. The agent's executor produces
// these records, its spool keeps them, the broker stores them by
// (run, seq) and the CLI prints them.
package events

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Level is the severity of an event.
type Level int8

// The levels, in increasing severity.
const (
	Debug Level = iota
	Info
	Warn
	Error
)

var levelNames = [...]string{"DEBUG", "INFO", "WARN", "ERROR"}

func (l Level) String() string {
	if l < Debug || l > Error {
		return "LEVEL(" + strconv.Itoa(int(l)) + ")"
	}
	return levelNames[l]
}

// ParseLevel reads a level name, case-insensitively; WARNING, CRITICAL
// and FATAL are accepted as Python's logging and glog write them.
func ParseLevel(s string) (Level, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "DEBUG", "TRACE":
		return Debug, nil
	case "INFO":
		return Info, nil
	case "WARN", "WARNING":
		return Warn, nil
	case "ERROR", "CRITICAL", "FATAL":
		return Error, nil
	}
	return Info, fmt.Errorf("unknown level %q: use DEBUG, INFO, WARN or ERROR", s)
}

// MarshalText writes the level name.
func (l Level) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads a level name.
func (l *Level) UnmarshalText(b []byte) error {
	v, err := ParseLevel(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// Components used by the agent itself. Output lines carry the component
// the process named (see Classifier) or StdoutComponent/StderrComponent.
const (
	RuntimeInit     = "runtime.init"
	RuntimeBundle   = "runtime.bundle"
	ExecutorComp    = "executor"
	NaNGuard        = "nan-guard"
	MetricsComp     = "metrics"
	StdoutComponent = "stdout"
	StderrComponent = "stderr"
)

// Event is one structured log record of a run.
type Event struct {
	// Seq is the per-run sequence number, assigned when the event is
	// spooled; events and metric points of a run share one sequence, so
	// a gap-free sequence proves nothing was lost.
	Seq       uint64            `json:"seq,omitempty"`
	Time      time.Time         `json:"ts"`
	Level     Level             `json:"level"`
	Component string            `json:"component"`
	Message   string            `json:"msg"`
	Fields    map[string]string `json:"fields,omitempty"`
}

// TimeLayout is the timestamp of the text form: UTC, milliseconds.
const TimeLayout = "2006-01-02 15:04:05.000"

// Text renders the event as one line:
//
//	[2024-04-12 08:23:15.221] INFO runtime.init CUDA driver 535.104.05 loaded (expected 535.104.05)
//
// Fields follow the message as key=value in key order, values quoted when
// they hold spaces, quotes or are empty, so the line stays one line and
// greppable.
func (e Event) Text() string {
	var b strings.Builder
	b.Grow(len(e.Message) + 48)
	b.WriteByte('[')
	b.WriteString(e.Time.UTC().Format(TimeLayout))
	b.WriteString("] ")
	b.WriteString(e.Level.String())
	b.WriteByte(' ')
	b.WriteString(e.Component)
	b.WriteByte(' ')
	// A message with a line break would split the record in a log file.
	b.WriteString(lineBreaks.Replace(e.Message))
	if len(e.Fields) > 0 {
		keys := make([]string, 0, len(e.Fields))
		for k := range e.Fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := e.Fields[k]
			b.WriteByte(' ')
			b.WriteString(k)
			b.WriteByte('=')
			if v == "" || strings.ContainsAny(v, " \t\"\n\r=") {
				v = strconv.Quote(v)
			}
			b.WriteString(v)
		}
	}
	return b.String()
}

var lineBreaks = strings.NewReplacer("\n", `\n`, "\r", `\r`)

// eventJSON fixes the JSON form: time as RFC 3339 UTC with milliseconds.
type eventJSON struct {
	Seq       uint64            `json:"seq,omitempty"`
	Time      string            `json:"ts"`
	Level     Level             `json:"level"`
	Component string            `json:"component"`
	Message   string            `json:"msg"`
	Fields    map[string]string `json:"fields,omitempty"`
}

// JSONTimeLayout is the timestamp of the JSON form.
const JSONTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// MarshalJSON writes {"seq":1,"ts":"2024-04-12T08:23:15.221Z","level":"INFO",...}.
func (e Event) MarshalJSON() ([]byte, error) {
	return e.AppendJSON(nil), nil
}

// AppendJSON appends the JSON form to b. It is what MarshalJSON returns,
// written by hand because the agent encodes every output line and
// encoding/json's reflection and re-compaction cost several times more.
func (e Event) AppendJSON(b []byte) []byte {
	b = append(b, '{')
	if e.Seq != 0 {
		b = append(b, `"seq":`...)
		b = strconv.AppendUint(b, e.Seq, 10)
		b = append(b, ',')
	}
	b = append(b, `"ts":"`...)
	b = e.Time.UTC().AppendFormat(b, JSONTimeLayout)
	b = append(b, `","level":"`...)
	b = append(b, e.Level.String()...)
	b = append(b, `","component":`...)
	b = appendJSONString(b, e.Component)
	b = append(b, `,"msg":`...)
	b = appendJSONString(b, e.Message)
	if len(e.Fields) > 0 {
		keys := make([]string, 0, len(e.Fields))
		for k := range e.Fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = append(b, `,"fields":{`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, e.Fields[k])
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendJSONString writes s as a JSON string: printable ASCII is copied,
// anything else goes through encoding/json so escaping stays exact.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// UnmarshalJSON reads the JSON form.
func (e *Event) UnmarshalJSON(b []byte) error {
	var j eventJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339Nano, j.Time)
	if err != nil {
		return fmt.Errorf("event ts: %w", err)
	}
	*e = Event{Seq: j.Seq, Time: t.UTC(), Level: j.Level, Component: j.Component, Message: j.Message, Fields: j.Fields}
	return nil
}

// Now returns the current time as events carry it: UTC, truncated to the
// millisecond so text and JSON forms agree.
func Now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }
