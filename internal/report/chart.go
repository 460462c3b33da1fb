package report

import (
	"math"

	"github.com/gpupass/gpupass/internal/metrics"
)

// Sizes of the downsampled curves: Mermaid's xychart gets crowded past a
// few dozen points per line and GitHub caps diagram source size; an SVG
// polyline stays smooth and small at a few hundred buckets.
const (
	MermaidPoints = 50
	SVGPoints     = 400
)

// Chart is every run on one grid of steps over the range common to all
// runs (Mermaid's xychart needs one x axis for all lines).
type Chart struct {
	Lo, Hi   int64
	Steps    []int64
	Lines    []Line
	Min, Max float64
	// Held counts buckets with no finite value, drawn at the previous
	// value.
	Held int
	// Dropped lists runs with no finite value in the chart range.
	Dropped []string
}

// Line is one run's values on the chart grid.
type Line struct {
	Label  string
	Values []float64
}

// Curve is one run downsampled on its own steps.
type Curve struct {
	Label  string
	Points []metrics.Point
}

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
	span := hi - lo + 1
	if int64(n) > span {
		n = int(span)
	}
	c := &Chart{Lo: lo, Hi: hi, Steps: make([]int64, n), Min: math.Inf(1), Max: math.Inf(-1)}
	for i := range n {
		c.Steps[i] = lo + int64((float64(i)+0.5)*float64(span)/float64(n))
	}
	if n == 1 {
		c.Steps[0] = lo
	}
	sums := make([]float64, n)
	counts := make([]int, n)
	for _, s := range series {
		clear(sums)
		clear(counts)
		for _, p := range s.Points {
			if p.Step < lo || p.Step > hi || !finite(p.Value) {
				continue
			}
			b := min(int(float64(p.Step-lo)/float64(span)*float64(n)), n-1)
			sums[b] += p.Value
			counts[b]++
		}
		line := Line{Label: s.Label, Values: make([]float64, n)}
		prev := math.NaN()
		for i := range n {
			v := math.NaN()
			if counts[i] > 0 {
				v = sums[i] / float64(counts[i])
			} else if x, ok := s.ValueAt(c.Steps[i]); ok && finite(x) {
				v = x
			}
			if !finite(v) {
				c.Held++
				v = prev
			}
			line.Values[i] = v
			if finite(v) {
				prev = v
				c.Min, c.Max = min(c.Min, v), max(c.Max, v)
			}
		}
		// Leading buckets with no finite value take the first finite one.
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
				line.Values[i] = first
			}
		}
		c.Lines = append(c.Lines, line)
	}
	if !finite(c.Min) || len(c.Lines) == 0 {
		return nil
	}
	return c
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
