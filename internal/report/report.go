// Package report turns metric series into comparison figures (per run and
// per pair of runs), a verdict against a tolerance, and renderings:
// markdown with a Mermaid chart, SVG and PNG charts (gonum/plot), JSON and
// JUnit XML.
//
// It is pure: no I/O beyond the writers it is given, no network
// (internal/depcheck enforces this).
package report

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/metrics"
)

// Verdicts.
const (
	Consistent   = "consistent"
	Diverged     = "diverged"
	Inconclusive = "inconclusive" // some pair could not be compared
	// InProgress is not a verdict: some run has not ended, and the
	// report shows where each stands (BuildProgress).
	InProgress = "in progress"
)

// Tolerance bounds the loss difference between two runs at every common
// step. Each bound that is set is its own check and all must hold.
type Tolerance struct {
	Abs    float64 `json:"abs,omitempty"`
	Rel    float64 `json:"rel,omitempty"`
	HasAbs bool    `json:"-"`
	HasRel bool    `json:"-"`
}

// FieldLabel is the field of Build's label errors (*fielderr.Error):
// the command layer names the flag or input that labels runs.
const FieldLabel = "label"

// DefaultTolerance is used when none is given: 5% relative.
var DefaultTolerance = Tolerance{Rel: 0.05, HasRel: true}

// ToleranceError is a tolerance that does not parse. It names the value
// and the problem; the caller adds where the value came from (a flag, a
// CI input).
type ToleranceError struct {
	Value   string
	Problem string
}

func (e *ToleranceError) Error() string { return fmt.Sprintf("tolerance %q: %s", e.Value, e.Problem) }

// ParseTolerance reads "0.05" (absolute), "5%" (relative), or a comma list
// of "abs=0.05" and "rel=0.02" / "rel=2%".
func ParseTolerance(s string) (Tolerance, error) {
	var t Tolerance
	if strings.TrimSpace(s) == "" {
		return DefaultTolerance, nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		kind, val, ok := strings.Cut(part, "=")
		if !ok {
			val = part
			kind = "abs"
			if strings.HasSuffix(part, "%") {
				kind = "rel"
			}
		}
		pct := strings.HasSuffix(val, "%")
		f, err := strconv.ParseFloat(strings.TrimSuffix(val, "%"), 64)
		if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return t, &ToleranceError{Value: s, Problem: fmt.Sprintf("%q is not a non-negative number; use e.g. 0.05, 2%% or abs=0.05,rel=2%%", val)}
		}
		if pct {
			f /= 100
		}
		switch kind {
		case "abs":
			if pct {
				return t, &ToleranceError{Value: s, Problem: "abs takes a plain number, not a percentage"}
			}
			t.Abs, t.HasAbs = f, true
		case "rel":
			t.Rel, t.HasRel = f, true
		default:
			return t, &ToleranceError{Value: s, Problem: fmt.Sprintf("unknown kind %q; use abs= or rel=", kind)}
		}
	}
	return t, nil
}

// MarshalJSON writes only the bounds that are set, zero included.
func (t Tolerance) MarshalJSON() ([]byte, error) {
	m := map[string]float64{}
	if t.HasAbs {
		m["abs"] = t.Abs
	}
	if t.HasRel {
		m["rel"] = t.Rel
	}
	return json.Marshal(m)
}

// String renders the tolerance for people.
func (t Tolerance) String() string {
	var parts []string
	if t.HasAbs {
		parts = append(parts, "|Δ| ≤ "+Num(t.Abs))
	}
	if t.HasRel {
		parts = append(parts, "|Δ|/|"+"ref| ≤ "+pct(t.Rel))
	}
	return strings.Join(parts, " and ")
}

func pct(f float64) string {
	return strconv.FormatFloat(f*100, 'g', 4, 64) + "%"
}

// Float is a float64 whose JSON form keeps NaN and ±Inf as the strings
// "NaN", "+Inf", "-Inf": they are findings, not values to drop.
type Float float64

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	switch {
	case math.IsNaN(v):
		return []byte(`"NaN"`), nil
	case math.IsInf(v, 1):
		return []byte(`"+Inf"`), nil
	case math.IsInf(v, -1):
		return []byte(`"-Inf"`), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// Run holds the figures of one run.
type Run struct {
	Label     string `json:"label"`
	Source    string `json:"source"`
	Format    string `json:"format"`
	Metric    string `json:"metric"`
	Points    int    `json:"points"`
	FirstStep int64  `json:"first_step"`
	LastStep  int64  `json:"last_step"`
	FinalLoss Float  `json:"final_loss"`
	// MinLoss ignores NaN and ±Inf; MinStep is where it was logged.
	MinLoss Float `json:"min_loss"`
	MinStep int64 `json:"min_step"`
	// Times are absent when the source carries no timestamps.
	WallSeconds     *float64 `json:"wall_seconds,omitempty"`
	StepsPerSecond  *float64 `json:"steps_per_second,omitempty"`
	TimeToFirstStep *float64 `json:"time_to_first_step_seconds,omitempty"`
	CostUSD         *float64 `json:"cost_usd,omitempty"`
	// PricePerHour (USD) is what CostUSD is computed from: the node's
	// price on the broker's run record, or --price.
	PricePerHour float64 `json:"price_per_hour,omitempty"`
	Restarts     int     `json:"restarts"`
	// NonFinite counts NaN/Inf values of the run.
	NonFinite int              `json:"non_finite"`
	Problems  metrics.Problems `json:"problems"`
	Notes     []string         `json:"notes,omitempty"`
	Simulated bool             `json:"simulated,omitempty"`
	// Disputed says why the run's log is not proof (metrics.Series).
	Disputed string `json:"log_disputed,omitempty"`
	// Slurm is the batch job the run trained in, when it ran on Slurm.
	Slurm *metrics.Slurm `json:"slurm,omitempty"`
	// State and Running are set in an in-progress report only
	// (BuildProgress): the run's state on the broker, and whether it
	// had not ended, its figures being those so far.
	State   string `json:"state,omitempty"`
	Running bool   `json:"running,omitempty"`
	// DashboardURL is the run's dashboard page as its broker gave it
	// (metrics.Series).
	DashboardURL string `json:"dashboard_url,omitempty"`
}

// Check is one tolerance check of one pair.
type Check struct {
	Kind  string  `json:"kind"` // abs | rel
	Limit float64 `json:"limit"`
	// Worst is the largest observed difference of this kind (NaN steps
	// excluded) and WorstStep where it occurred.
	Worst     Float  `json:"worst"`
	WorstStep int64  `json:"worst_step"`
	Failures  int    `json:"failures"`
	FirstFail *int64 `json:"first_fail_step,omitempty"`
	Passed    bool   `json:"passed"`
}

// Pair compares run B against run A (A is the reference for relative
// differences).
type Pair struct {
	A           string `json:"a"`
	B           string `json:"b"`
	CommonSteps int    `json:"common_steps"`
	// MaxAbsDelta is max |B−A| over common steps with finite values.
	MaxAbsDelta     Float `json:"max_abs_delta"`
	MaxAbsDeltaStep int64 `json:"max_abs_delta_step"`
	// RelFinalDiff is (B−A)/|A| at the last common step.
	RelFinalDiff Float `json:"rel_final_diff"`
	// FirstDivergence is the first common step where a check fails.
	FirstDivergence *int64  `json:"first_divergence_step,omitempty"`
	NonFiniteSteps  int     `json:"non_finite_steps"`
	Checks          []Check `json:"checks"`
	Verdict         string  `json:"verdict"`
	Note            string  `json:"note,omitempty"`
	// Error says why the pair could not be compared (no common steps).
	Error string `json:"error,omitempty"`
	// Disputed names the runs of the pair whose log is disputed: the
	// figures are shown, but the verdict is inconclusive.
	Disputed []string `json:"log_disputed,omitempty"`
}

// Report is a whole comparison.
type Report struct {
	Metric    string    `json:"metric"`
	Tolerance Tolerance `json:"tolerance"`
	Verdict   string    `json:"verdict"`
	Runs      []Run     `json:"runs"`
	Pairs     []Pair    `json:"pairs"`
	Notes     []string  `json:"notes,omitempty"`
	Simulated bool      `json:"simulated,omitempty"`
	// Chart is the downsampled curves for the inline chart.
	Chart *Chart `json:"-"`
	// Curves are the per-run downsampled curves for file charts.
	Curves []Curve `json:"-"`
	// Links lead back to where the report came from (the CI run, its
	// artifacts, each run's dashboard page). They are the caller's to
	// set: a report is the same comparison wherever it was built.
	Links []Link `json:"-"`
}

// Link is one place a reader of the report may go.
type Link struct {
	Label string
	URL   string
}

// Build computes the figures of series (normalised, labelled) and the
// verdict of every pair against tol.
func Build(series []*metrics.Series, tol Tolerance) (*Report, error) {
	r, err := newReport(series, tol, Consistent)
	if err != nil {
		return nil, err
	}
	if len(series) == 1 {
		r.Notes = append(r.Notes, "only one run: figures only, nothing to compare")
	}
	for i := 0; i < len(series); i++ {
		for j := i + 1; j < len(series); j++ {
			p := comparePair(series[i], series[j], tol)
			for _, s := range []*metrics.Series{series[i], series[j]} {
				if s.Disputed != "" {
					p.Disputed = append(p.Disputed, s.Label)
				}
			}
			if len(p.Disputed) > 0 {
				// Either way the figures could be forged: neither
				// "consistent" nor "diverged" would be proof.
				p.Verdict = Inconclusive
			}
			switch p.Verdict {
			case Diverged:
				r.Verdict = Diverged
			case Inconclusive:
				if r.Verdict == Consistent {
					r.Verdict = Inconclusive
				}
			}
			r.Pairs = append(r.Pairs, p)
		}
	}
	for _, s := range series {
		if s.Disputed != "" && r.Verdict == Consistent {
			r.Verdict = Inconclusive // a single run, or one compared with nothing
		}
	}
	r.Chart = buildChart(series, MermaidPoints)
	if r.Chart == nil && len(series) > 1 {
		r.Notes = append(r.Notes, "no step range common to all runs: inline chart left out (see the SVG)")
	}
	for _, s := range series {
		r.Curves = append(r.Curves, Curve{Label: s.Label, Points: Downsample(s.Points, SVGPoints), Restarts: s.RestartAt})
	}
	return r, nil
}

// newReport checks the labels of series and starts a report with verdict
// and every run's figures.
func newReport(series []*metrics.Series, tol Tolerance, verdict string) (*Report, error) {
	if len(series) == 0 {
		return nil, fmt.Errorf("no runs to compare")
	}
	if !tol.HasAbs && !tol.HasRel {
		tol = DefaultTolerance
	}
	seen := map[string]string{}
	for _, s := range series {
		if s.Label == "" {
			return nil, &fielderr.Error{Field: FieldLabel, Problem: fmt.Sprintf("the run from %s has none; name it as NAME=%s", s.Source, s.Source)}
		}
		if prev, ok := seen[s.Label]; ok {
			return nil, fielderr.New(FieldLabel, s.Label, "names both %s and %s; give each run its own, NAME=INPUT", prev, s.Source)
		}
		seen[s.Label] = s.Source
	}
	r := &Report{Tolerance: tol, Verdict: verdict}
	metricsSeen := map[string]bool{}
	for _, s := range series {
		r.Runs = append(r.Runs, runFigures(s))
		metricsSeen[s.Metric] = true
		r.Simulated = r.Simulated || s.Simulated
	}
	r.Metric = series[0].Metric
	if len(metricsSeen) > 1 {
		r.Metric = "loss"
		r.Notes = append(r.Notes, "runs use different metric names (JSONL loss, CSV train_loss, TensorBoard tag); compared as the same loss")
	}
	return r, nil
}

// BuildProgress is the report on runs of which some have not ended
// (Series.Running): each run's state and figures so far, and the curves
// so far, under the verdict InProgress. It compares no pairs: figures
// that are not final decide nothing, and the verdict is Build's once
// every run has ended.
func BuildProgress(series []*metrics.Series, tol Tolerance) (*Report, error) {
	r, err := newReport(series, tol, InProgress)
	if err != nil {
		return nil, err
	}
	var drawn []*metrics.Series
	for i, s := range series {
		r.Runs[i].State, r.Runs[i].Running = s.State, s.Running
		if len(s.Points) > 0 {
			drawn = append(drawn, s)
		}
	}
	// The chart draws the runs that have logged something: one still
	// pending would leave no common step for the others.
	r.Chart = buildChart(drawn, MermaidPoints)
	for _, s := range drawn {
		r.Curves = append(r.Curves, Curve{Label: s.Label, Points: Downsample(s.Points, SVGPoints), Restarts: s.RestartAt})
	}
	return r, nil
}

// Running counts the runs that had not ended when the report was built.
func (r *Report) Running() int {
	n := 0
	for _, run := range r.Runs {
		if run.Running {
			n++
		}
	}
	return n
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func runFigures(s *metrics.Series) Run {
	p := s.Points
	r := Run{
		Label: s.Label, Source: s.Source, Format: s.Format, Metric: s.Metric,
		Points: len(p), Restarts: s.Restarts, Problems: s.Problems, Notes: s.Notes,
		Simulated: s.Simulated, MinLoss: Float(math.NaN()), PricePerHour: s.PricePerHour, Disputed: s.Disputed,
		Slurm: s.Slurm, DashboardURL: s.DashboardURL,
	}
	if len(p) == 0 {
		return r
	}
	r.FirstStep, r.LastStep = p[0].Step, p[len(p)-1].Step
	r.FinalLoss = Float(p[len(p)-1].Value)
	for _, q := range p {
		if !finite(q.Value) {
			r.NonFinite++
			continue
		}
		if math.IsNaN(float64(r.MinLoss)) || q.Value < float64(r.MinLoss) {
			r.MinLoss, r.MinStep = Float(q.Value), q.Step
		}
	}
	// Times: first and last timestamped points (a restart may leave gaps,
	// which count as wall time: the run was not done).
	var t0, t1 int64
	var s0, s1 int64
	for _, q := range p {
		if q.Time != 0 {
			if t0 == 0 || q.Time < t0 {
				t0, s0 = q.Time, q.Step
			}
			// >= : with millisecond stamps several steps share the last
			// time; the highest of them is how far the run got by then.
			if q.Time >= t1 {
				t1, s1 = q.Time, q.Step
			}
		}
	}
	if t0 != 0 && t1 > t0 {
		wall := float64(t1-t0) / 1e9
		r.WallSeconds = &wall
		if s1 > s0 {
			tp := float64(s1-s0) / wall
			r.StepsPerSecond = &tp
		}
		if s.PricePerHour > 0 {
			from := t0
			if s.Start != 0 && s.Start < t0 {
				from = s.Start
			}
			c := float64(t1-from) / 3.6e12 * s.PricePerHour
			r.CostUSD = &c
		}
	}
	// A start after the first step means the clocks of broker and node
	// disagree; no figure beats a negative one.
	if s.Start != 0 && t0 != 0 && t0 >= s.Start {
		ttf := float64(t0-s.Start) / 1e9
		r.TimeToFirstStep = &ttf
	}
	return r
}

func comparePair(a, b *metrics.Series, tol Tolerance) Pair {
	p := Pair{A: a.Label, B: b.Label, MaxAbsDelta: Float(math.NaN()), RelFinalDiff: Float(math.NaN())}
	var checks []*Check
	if tol.HasAbs {
		checks = append(checks, &Check{Kind: "abs", Limit: tol.Abs, Worst: Float(math.NaN())})
	}
	if tol.HasRel {
		checks = append(checks, &Check{Kind: "rel", Limit: tol.Rel, Worst: Float(math.NaN())})
	}
	var lastX, lastY float64
	n, _, note, err := metrics.AlignFunc(a, b, func(step int64, x, y float64) {
		lastX, lastY = x, y
		d := math.Abs(y - x)
		nonFinite := !finite(x) || !finite(y)
		if nonFinite {
			p.NonFiniteSteps++
		} else if math.IsNaN(float64(p.MaxAbsDelta)) || d > float64(p.MaxAbsDelta) {
			p.MaxAbsDelta, p.MaxAbsDeltaStep = Float(d), step
		}
		failedHere := false
		for _, c := range checks {
			var v float64
			if c.Kind == "abs" {
				v = d
			} else {
				v = relDiff(x, y)
			}
			// A NaN or Inf on either side fails every check: a run that
			// blew up did not train the same.
			fail := nonFinite || v > c.Limit
			if !nonFinite && (math.IsNaN(float64(c.Worst)) || v > float64(c.Worst)) {
				c.Worst, c.WorstStep = Float(v), step
			}
			if fail {
				c.Failures++
				if c.FirstFail == nil {
					s := step
					c.FirstFail = &s
				}
				failedHere = true
			}
		}
		if failedHere && p.FirstDivergence == nil {
			s := step
			p.FirstDivergence = &s
		}
	})
	if err != nil {
		p.Error = err.Error()
		p.Verdict = Inconclusive
		return p
	}
	p.CommonSteps = n
	p.Note = note
	x, y := lastX, lastY
	if x != 0 {
		p.RelFinalDiff = Float((y - x) / math.Abs(x))
	} else if y == 0 {
		p.RelFinalDiff = 0
	} else {
		p.RelFinalDiff = Float(math.Inf(1))
	}
	p.Verdict = Consistent
	for _, c := range checks {
		c.Passed = c.Failures == 0
		if !c.Passed {
			p.Verdict = Diverged
		}
		p.Checks = append(p.Checks, *c)
	}
	return p
}

func relDiff(ref, v float64) float64 {
	d := math.Abs(v - ref)
	if d == 0 {
		return 0
	}
	if ref == 0 {
		return math.Inf(1)
	}
	return d / math.Abs(ref)
}

// Num formats a figure for people: 5 significant digits, NaN and ±Inf
// spelled out.
func Num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', 5, 64)
}
