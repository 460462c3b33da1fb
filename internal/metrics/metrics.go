// Package metrics reads training metric series from files (gpupass JSONL and
// log lines, Lightning CSVLogger metrics.csv, TensorBoard event files) and
// normalises them: UTC times, sorted and de-duplicated steps, alignment of two
// series on common steps.
//
// It is pure: it reads bytes from io.Readers and files and never talks to the
// network (internal/depcheck enforces this). Fetching metrics of an
// allocation from the broker is the caller's business.
package metrics

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/gpupass/gpupass/internal/events"
)

// Point is one logged value. Time is Unix nanoseconds in UTC, 0 when the
// source has no timestamp; a plain int64 keeps a million-point series at
// 24 bytes a point.
type Point struct {
	Step  int64
	Value float64
	Time  int64
}

// Series is the metric of one run, as read and then normalised.
type Series struct {
	Label  string  `json:"label"`
	Source string  `json:"source"`
	Metric string  `json:"metric"`
	Format string  `json:"format"`
	Points []Point `json:"-"`
	// Start is when the run started (Unix ns UTC), 0 when unknown; it
	// gives the time to first step.
	Start int64 `json:"-"`
	// Restarts counts restarts: explicit restart events plus every place
	// where the step went backwards in logging order.
	Restarts int `json:"restarts"`
	// RestartAt lists where restarts show in the log, in logging order:
	// an explicit restart event, a point of a later attempt (a process
	// start) than the one before it, or a step that went backwards. The
	// first MaxRestartAt are kept: a log that jumps back at every line
	// is counted, not listed.
	RestartAt []Restart `json:"restart_at,omitempty"`
	// PricePerHour is the cost of the run's hardware in USD per hour, 0 when
	// unknown.
	PricePerHour float64 `json:"price_per_hour,omitempty"`
	// Simulated marks series derived from a simulated hardware profile.
	Simulated bool `json:"simulated,omitempty"`
	// Problems lists what was wrong with the input (malformed lines,
	// corrupt records); the first few carry a location.
	Problems Problems `json:"problems"`
	// Notes says what normalisation did (duplicates dropped, sorting).
	Notes []string `json:"notes,omitempty"`
	// Disputed, when set, says why the run's log is not proof (the
	// broker refused records sent twice at one seq with different
	// content): its figures cannot decide a comparison.
	Disputed string `json:"disputed,omitempty"`
	// Slurm is the batch job the run trained in (a broker run on a
	// Slurm node); nil otherwise.
	Slurm *Slurm `json:"slurm,omitempty"`
	// State is the run's state on the broker when it was read
	// (running, succeeded…); empty for a file.
	State string `json:"state,omitempty"`
	// Running marks a run that had not ended when it was read: its
	// points are those logged so far.
	Running bool `json:"running,omitempty"`
	// DashboardURL is the run's page on its broker's dashboard, at the
	// address the broker says users reach it (serve --public-url); empty
	// for a file or a broker with none.
	DashboardURL string `json:"dashboard_url,omitempty"`
}

// Restart is one place a run restarted: After is the last step logged
// before it, Resume the first step logged after it (lower than After when
// the run went back to a checkpoint).
type Restart struct {
	After  int64 `json:"after"`
	Resume int64 `json:"resume"`
	// NonFinite: the last value logged before it was NaN or infinite
	// (the agent's NaN guard restarts a run from its checkpoint so).
	NonFinite bool `json:"non_finite,omitempty"`
}

// RestartTracker finds restarts in points read in logging order: a point
// of a later attempt than the one before it, or one that follows an
// explicit restart event (Event).
type RestartTracker struct {
	attempt   int
	restarted bool
}

// Event notes an explicit restart event.
func (t *RestartTracker) Event() { t.restarted = true }

// Point adds the restart that shows before a point of attempt (0:
// unknown) at step to s.RestartAt, given the points read so far.
func (t *RestartTracker) Point(s *Series, attempt int, step int64) {
	if attempt > 0 && t.attempt > 0 && attempt > t.attempt {
		t.restarted = true
	}
	if attempt > 0 {
		t.attempt = attempt
	}
	if t.restarted && len(s.Points) > 0 && len(s.RestartAt) < MaxRestartAt {
		last := s.Points[len(s.Points)-1]
		s.RestartAt = append(s.RestartAt, Restart{After: last.Step, Resume: step, NonFinite: math.IsNaN(last.Value) || math.IsInf(last.Value, 0)})
	}
	t.restarted = false
}

// MaxRestartAt bounds Series.RestartAt.
const MaxRestartAt = 64

// MaxStep bounds steps: events.MaxStep, which the agent enforces.
const MaxStep = events.MaxStep

// MaxReported is how many problems keep their location; the rest are
// only counted.
const MaxReported = 5

// Problem is one unreadable piece of input.
type Problem struct {
	Where  string `json:"where"` // "line 12", "record 3 at byte 1024"
	Reason string `json:"reason"`
}

// Problems counts bad input and keeps the first MaxReported.
type Problems struct {
	Count int       `json:"count"`
	First []Problem `json:"first,omitempty"`
}

// Add records one problem.
func (p *Problems) Add(where, reason string) {
	p.Count++
	if len(p.First) < MaxReported {
		p.First = append(p.First, Problem{Where: where, Reason: reason})
	}
}

// String summarises the problems for a message.
func (p Problems) String() string {
	if p.Count == 0 {
		return ""
	}
	parts := make([]string, 0, len(p.First))
	for _, pr := range p.First {
		parts = append(parts, pr.Where+": "+pr.Reason)
	}
	s := fmt.Sprintf("%d malformed", p.Count)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, "; ")
		if p.Count > len(parts) {
			s += fmt.Sprintf("; %d more", p.Count-len(parts))
		}
		s += ")"
	}
	return s
}

// FieldMetric is the field of the errors about which metric to read
// (*fielderr.Error): the command layer names its flag.
const FieldMetric = "metric"

// EmptyError says a series ended up with no points. It is the one input
// problem that is fatal.
type EmptyError struct {
	Source   string
	Metric   string
	Problems Problems
	// Read says what was tried, e.g. that a text log had no line with
	// the metric; empty for a file read in one known format.
	Read string
	// PatternOption names how the caller takes a metric pattern
	// ("--metric-pattern"); the command layer sets it.
	PatternOption string
}

func (e *EmptyError) Error() string {
	msg := fmt.Sprintf("%s: no %s values found", e.Source, e.Metric)
	if e.Metric == "" {
		msg = fmt.Sprintf("%s: no loss metric found", e.Source)
	}
	if e.Read != "" {
		msg += "; " + e.Read
	}
	if e.Problems.Count > 0 {
		msg += "; " + e.Problems.String()
	}
	if e.Read != "" {
		opt := e.PatternOption
		if opt == "" {
			opt = "a metric pattern"
		}
		return msg + "; give " + opt + " that finds the value, e.g. '" + PatternExample + "'"
	}
	return msg + "; check the file format and the metric to read"
}

// Normalize sorts the points by step, keeps the last logged value of a
// repeated step (a step logged again after a restart supersedes the old
// one) and counts restarts. Points must be in logging order.
func (s *Series) Normalize() {
	pts := s.Points
	backwards := 0
	sorted := true
	// Explicit restart events, when the log has them, are where the run
	// restarted (as they are what Restarts counts); otherwise the step
	// jumps are. A second Normalize finds the points sorted.
	listJumps := len(s.RestartAt) == 0
	for i := 1; i < len(pts); i++ {
		if pts[i].Step < pts[i-1].Step {
			backwards++
			sorted = false
			if listJumps && len(s.RestartAt) < MaxRestartAt {
				s.RestartAt = append(s.RestartAt, Restart{After: pts[i-1].Step, Resume: pts[i].Step})
			}
		}
	}
	counted := ""
	if s.Restarts == 0 && backwards > 0 {
		// Explicit restart events already count what the step jumps show.
		s.Restarts = backwards
		counted = " (counted as restarts)"
	}
	if !sorted {
		// Stable sort keeps logging order within a step, so "last wins"
		// below picks the most recent value.
		sort.SliceStable(pts, func(i, j int) bool { return pts[i].Step < pts[j].Step })
		s.Notes = append(s.Notes, fmt.Sprintf("steps went backwards %d time(s)%s; sorted by step", backwards, counted))
	}
	out := pts[:0]
	dups := 0
	for i, p := range pts {
		if i > 0 && len(out) > 0 && out[len(out)-1].Step == p.Step {
			out[len(out)-1] = p
			dups++
			continue
		}
		out = append(out, p)
	}
	if dups > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d repeated step(s): kept the last logged value", dups))
	}
	s.Points = out
}

// NonFinite counts NaN and ±Inf values.
func (s *Series) NonFinite() int {
	n := 0
	for _, p := range s.Points {
		if math.IsNaN(p.Value) || math.IsInf(p.Value, 0) {
			n++
		}
	}
	return n
}
