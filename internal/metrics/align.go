package metrics

import (
	"fmt"
	"sort"
)

// Aligned holds two series on one grid of steps.
type Aligned struct {
	Steps []int64
	A, B  []float64
	// Interpolated counts grid values that were not logged at that step
	// in the other series and were interpolated linearly on step.
	Interpolated int
	// Note says how the grid was built, for the report.
	Note string
}

// NoOverlapError says two runs share no step range.
type NoOverlapError struct {
	A, B          string
	AFirst, ALast int64
	BFirst, BLast int64
}

func (e *NoOverlapError) Error() string {
	return fmt.Sprintf("%s (steps %d..%d) and %s (steps %d..%d) have no steps in common", e.A, e.AFirst, e.ALast, e.B, e.BFirst, e.BLast)
}

// Align puts a and b (normalised) on common steps. Within the overlap of
// their step ranges the grid is the steps of the sparser series; the
// other series is read there exactly when it logged that step and by
// linear interpolation on step otherwise, so runs with different logging
// intervals compare like for like.
func Align(a, b *Series) (*Aligned, error) {
	pa, pb := a.Points, b.Points
	if len(pa) == 0 || len(pb) == 0 {
		return nil, fmt.Errorf("aligning %s and %s: a series is empty", a.Label, b.Label)
	}
	lo := max(pa[0].Step, pb[0].Step)
	hi := min(pa[len(pa)-1].Step, pb[len(pb)-1].Step)
	if lo > hi {
		return nil, &NoOverlapError{A: a.Label, B: b.Label, AFirst: pa[0].Step, ALast: pa[len(pa)-1].Step, BFirst: pb[0].Step, BLast: pb[len(pb)-1].Step}
	}
	// The grid is the sparser window; the other series is read from all
	// its points, since the neighbours of a grid step may lie outside it.
	wa, wb := window(pa, lo, hi), window(pb, lo, hi)
	grid, full := wa, pb
	swapped := false
	if len(wa) == 0 || (len(wb) > 0 && len(wb) < len(wa)) {
		grid, full = wb, pa
		swapped = true
	}
	out := &Aligned{Steps: make([]int64, len(grid)), A: make([]float64, len(grid)), B: make([]float64, len(grid))}
	j := 0
	for i, p := range grid {
		for j+1 < len(full) && full[j+1].Step <= p.Step {
			j++
		}
		var v float64
		if full[j].Step == p.Step {
			v = full[j].Value
		} else {
			// lo <= p.Step <= hi guarantees full[j] < p.Step < full[j+1].
			l, r := full[j], full[j+1]
			v = l.Value + (r.Value-l.Value)*float64(p.Step-l.Step)/float64(r.Step-l.Step)
			out.Interpolated++
		}
		out.Steps[i] = p.Step
		if swapped {
			out.A[i], out.B[i] = v, p.Value
		} else {
			out.A[i], out.B[i] = p.Value, v
		}
	}
	gridLabel, other := a.Label, b.Label
	if swapped {
		gridLabel, other = other, gridLabel
	}
	out.Note = fmt.Sprintf("compared at %d step(s) of %s in %d..%d", len(grid), gridLabel, lo, hi)
	if out.Interpolated > 0 {
		out.Note += fmt.Sprintf("; logging intervals differ: %d value(s) of %s interpolated linearly on step", out.Interpolated, other)
	}
	return out, nil
}

// window returns the points with lo <= step <= hi of a sorted slice.
func window(p []Point, lo, hi int64) []Point {
	i := sort.Search(len(p), func(k int) bool { return p[k].Step >= lo })
	j := sort.Search(len(p), func(k int) bool { return p[k].Step > hi })
	return p[i:j]
}

// ValueAt returns the series value at step by linear interpolation, and
// false outside the logged range.
func (s *Series) ValueAt(step int64) (float64, bool) {
	p := s.Points
	if len(p) == 0 || step < p[0].Step || step > p[len(p)-1].Step {
		return 0, false
	}
	i := sort.Search(len(p), func(k int) bool { return p[k].Step >= step })
	if p[i].Step == step {
		return p[i].Value, true
	}
	l, r := p[i-1], p[i]
	return l.Value + (r.Value-l.Value)*float64(step-l.Step)/float64(r.Step-l.Step), true
}
