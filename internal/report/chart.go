package report

import (
	"cmp"
	"math"
	"slices"

	"github.com/gpupass/gpupass/internal/metrics"
)

// Sizes of the downsampled curves: Mermaid's xychart gets crowded past a
// few dozen points per line and GitHub caps diagram source size; an SVG
// line stays smooth and small at a few hundred buckets.
const (
	MermaidPoints = 50
	SVGPoints     = 400
)

// MermaidLabels is how many steps a Mermaid chart draws when they cannot
// be spread evenly over a numeric x axis: xychart-beta then writes every
// step under the axis, and at 50 labels they ran into one another.
const MermaidLabels = 16

// Chart is every run at the same steps over the range common to all runs
// (Mermaid's xychart needs one x axis for all lines).
type Chart struct {
	Lo, Hi int64
	// Steps are the steps drawn, Lo and Hi always among them. Linear:
	// for each of len(Steps) points spread evenly over Lo..Hi, the
	// logged step nearest to it (within half a step when every step is
	// logged), so a numeric x axis draws each where it was logged.
	// Otherwise every Every-th step logged by any run in Lo..Hi.
	Steps  []int64
	Linear bool
	Every  int
	// Logged counts the steps in Lo..Hi that any run logged.
	Logged int
	Lines  []Line
	// Min and Max are the extremes of the values drawn.
	Min, Max float64
	// Held counts points with no finite value, drawn at the previous
	// value.
	Held int
	// Dropped lists runs with no finite value in the chart range.
	Dropped []string
}

// Line is one run's values at the chart's steps.
type Line struct {
	Label  string
	Values []float64
	// Between counts the steps drawn that the run did not log: its value
	// there is on the straight line joining its neighbouring points, as
	// the chart would draw it anyway.
	Between int
}

// Curve is one run downsampled on its own steps.
type Curve struct {
	Label  string
	Points []metrics.Point
	// Restarts are where the run restarted, as its log shows them.
	Restarts []metrics.Restart
}

// buildChart samples every run at no more than n steps. The values drawn
// are the logged ones, not means of the steps around them, so that the
// first and last points and every spike the sample hits read as in the
// log.
func buildChart(series []*metrics.Series, n int) *Chart {
	if len(series) == 0 {
		return nil
	}
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	for _, s := range series {
		if len(s.Points) == 0 {
			return nil
		}
		lo = max(lo, s.Points[0].Step)
		hi = min(hi, s.Points[len(s.Points)-1].Step)
	}
	if lo > hi {
		return nil
	}
	var logged []int64
	for _, s := range series {
		for _, p := range s.Points {
			if p.Step >= lo && p.Step <= hi {
				logged = append(logged, p.Step)
			}
		}
	}
	slices.Sort(logged)
	logged = slices.Compact(logged)
	c := &Chart{Lo: lo, Hi: hi, Every: 1, Logged: len(logged), Min: math.Inf(1), Max: math.Inf(-1)}
	if steps := spread(logged, n); steps != nil {
		c.Steps, c.Linear = steps, true
	} else {
		c.Every = sampleEvery(len(logged), min(n, MermaidLabels))
		for i := 0; i < len(logged); i += c.Every {
			c.Steps = append(c.Steps, logged[i])
		}
		if c.Steps[len(c.Steps)-1] != hi {
			c.Steps = append(c.Steps, hi)
		}
	}
	for _, s := range series {
		line := Line{Label: s.Label, Values: make([]float64, len(c.Steps))}
		prev := math.NaN()
		for i, st := range c.Steps {
			v, _ := s.ValueAt(st)
			if !logs(s, st) {
				line.Between++
			}
			if !finite(v) {
				c.Held++
				v = prev
			}
			line.Values[i] = v
			if finite(v) {
				prev = v
			}
		}
		// Leading points with no finite value take the first finite one.
		first := math.NaN()
		for _, v := range line.Values {
			if finite(v) {
				first = v
				break
			}
		}
		if !finite(first) {
			// Nothing drawable: Mermaid cannot parse NaN, so the run is
			// left out of the chart (the tables still show it).
			c.Dropped = append(c.Dropped, s.Label)
			continue
		}
		for i, v := range line.Values {
			if !finite(v) {
				v = first
			}
			// Rounded here, as written, so the axis bounds hold what is
			// drawn.
			v = round5(v)
			line.Values[i] = v
			c.Min, c.Max = min(c.Min, v), max(c.Max, v)
		}
		c.Lines = append(c.Lines, line)
	}
	if !finite(c.Min) || len(c.Lines) == 0 {
		return nil
	}
	return c
}

// spread picks, for each of at most n points spread evenly from the first
// of logged to the last, the logged step nearest to it; nil when some
// point's step is further from it than half a step or 0.5% of the range
// (logging too uneven for a numeric axis), or when there is one step.
func spread(logged []int64, n int) []int64 {
	k := min(n, len(logged))
	if k < 2 {
		return nil
	}
	lo, hi := logged[0], logged[len(logged)-1]
	span := float64(hi - lo)
	slack := max(0.5, 0.005*span)
	out := make([]int64, k)
	j := 0
	for i := range out {
		target := float64(lo) + span*float64(i)/float64(k-1)
		for j+1 < len(logged) && math.Abs(float64(logged[j+1])-target) < math.Abs(float64(logged[j])-target) {
			j++
		}
		if math.Abs(float64(logged[j])-target) > slack || (i > 0 && logged[j] == out[i-1]) {
			return nil
		}
		out[i] = logged[j]
	}
	return out
}

// sampleEvery is the smallest stride that keeps every stride-th of
// logged steps, plus the last, within n points.
func sampleEvery(logged, n int) int {
	n = max(n, 2)
	if logged <= n {
		return 1
	}
	every := (logged - 1 + n - 2) / (n - 1)
	for {
		points := (logged-1)/every + 1
		if (logged-1)%every != 0 {
			points++
		}
		if points <= n {
			return every
		}
		every++
	}
}

// logs reports whether s logged a point at step.
func logs(s *metrics.Series, step int64) bool {
	_, ok := slices.BinarySearchFunc(s.Points, step, func(p metrics.Point, st int64) int { return cmp.Compare(p.Step, st) })
	return ok
}

// Downsample keeps at most about n points of p: the first and last, and
// the lowest and highest of each bucket in step order, so spikes survive.
func Downsample(p []metrics.Point, n int) []metrics.Point {
	if len(p) <= n || n < 4 {
		return p
	}
	buckets := n / 2
	out := make([]metrics.Point, 0, buckets*2+2)
	per := float64(len(p)) / float64(buckets)
	for b := range buckets {
		i0 := int(float64(b) * per)
		i1 := min(int(float64(b+1)*per), len(p))
		lo, hi := -1, -1
		for i := i0; i < i1; i++ {
			v := p[i].Value
			if !finite(v) {
				// Non-finite points are kept so the gap shows.
				if lo == -1 {
					lo = i
				} else {
					hi = i
				}
				continue
			}
			if lo == -1 || (finite(p[lo].Value) && v < p[lo].Value) {
				lo = i
			}
			if hi == -1 || (finite(p[hi].Value) && v > p[hi].Value) {
				hi = i
			}
		}
		switch {
		case lo == -1:
		case hi == -1 || hi == lo:
			out = append(out, p[lo])
		case lo < hi:
			out = append(out, p[lo], p[hi])
		default:
			out = append(out, p[hi], p[lo])
		}
	}
	if out[0].Step != p[0].Step {
		out = append([]metrics.Point{p[0]}, out...)
	}
	if out[len(out)-1].Step != p[len(p)-1].Step {
		out = append(out, p[len(p)-1])
	}
	return out
}
