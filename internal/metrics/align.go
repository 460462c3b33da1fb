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
	out := &Aligned{}
	n, interp, note, err := AlignFunc(a, b, func(step int64, x, y float64) {
		out.Steps = append(out.Steps, step)
		out.A = append(out.A, x)
		out.B = append(out.B, y)
	})
	if err != nil {
		return nil, err
	}
	if n == 0 {
		out.Steps, out.A, out.B = []int64{}, []float64{}, []float64{}
	}
	out.Interpolated, out.Note = interp, note
	return out, nil
}

// AlignFunc is Align without the arrays: it calls fn for each common step
// in order, so comparing million-point runs allocates nothing. It returns
// the number of steps, how many values were interpolated, and the note.
func AlignFunc(a, b *Series, fn func(step int64, x, y float64)) (n, interpolated int, note string, err error) {
	pa, pb := a.Points, b.Points
	if len(pa) == 0 || len(pb) == 0 {
		return 0, 0, "", fmt.Errorf("aligning %s and %s: a series is empty", a.Label, b.Label)
	}
	lo := max(pa[0].Step, pb[0].Step)
	hi := min(pa[len(pa)-1].Step, pb[len(pb)-1].Step)
	if lo > hi {
		return 0, 0, "", &NoOverlapError{A: a.Label, B: b.Label, AFirst: pa[0].Step, ALast: pa[len(pa)-1].Step, BFirst: pb[0].Step, BLast: pb[len(pb)-1].Step}
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
	j := 0
	for _, p := range grid {
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
			interpolated++
		}
		if swapped {
			fn(p.Step, v, p.Value)
		} else {
			fn(p.Step, p.Value, v)
		}
	}
	gridLabel, other := a.Label, b.Label
	if swapped {
		gridLabel, other = other, gridLabel
	}
	note = fmt.Sprintf("compared at %d step(s) of %s in %d..%d", len(grid), gridLabel, lo, hi)
	if interpolated > 0 {
		note += fmt.Sprintf("; logging intervals differ: %d value(s) of %s interpolated linearly on step", interpolated, other)
	}
	return len(grid), interpolated, note, nil
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
