package retry

import (
	"slices"
	"testing"
	"time"
)

// The loops' bounds: enroll; state edges and run reports; log uploads and
// the client's fail-over; the forge client; the broker's replica signals.
var loops = []struct{ lo, hi time.Duration }{
	{500 * time.Millisecond, 30 * time.Second},
	{100 * time.Millisecond, 5 * time.Second},
	{100 * time.Millisecond, 10 * time.Second},
	{time.Second, time.Minute},
	{time.Second, 30 * time.Second},
}

// TestJitterAndCap: two back-offs (two agents after the same broker
// restart) give different schedules, every delay stays within [lo, hi],
// the delays grow to near the cap, and Reset starts over from lo.
func TestJitterAndCap(t *testing.T) {
	t.Parallel()
	for _, c := range loops {
		a, b := Backoff(c.lo, c.hi), Backoff(c.lo, c.hi)
		var sa, sb []time.Duration
		for range 60 {
			sa, sb = append(sa, a.NextBackOff()), append(sb, b.NextBackOff())
		}
		if slices.Equal(sa, sb) {
			t.Errorf("%v..%v: two back-offs gave the same schedule %v: no jitter", c.lo, c.hi, sa)
		}
		if sa[0] > 3*c.lo || sb[0] > 3*c.lo {
			t.Errorf("%v..%v: first delays %v, %v; want at most 3×lo", c.lo, c.hi, sa[0], sb[0])
		}
		for _, d := range append(sa, sb...) {
			if d < c.lo || d > c.hi {
				t.Fatalf("%v..%v: delay %v outside [lo, hi]", c.lo, c.hi, d)
			}
		}
		if top := slices.Max(sa); top < c.hi/2 {
			t.Errorf("%v..%v: 60 delays never came near the cap (max %v)", c.lo, c.hi, top)
		}
		if sa[4] <= sa[0] {
			t.Errorf("%v..%v: delays do not grow: %v", c.lo, c.hi, sa[:5])
		}
		a.Reset()
		if d := a.NextBackOff(); d > 3*c.lo {
			t.Errorf("%v..%v: after Reset %v, want at most 3×lo", c.lo, c.hi, d)
		}
	}
}

// TestBounds: many draws stay in [lo, hi] even where hi leaves the
// library no room (hi < 3×lo, hi < lo), and a zero lo cannot spin.
func TestBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ lo, hi, wantLo, wantHi time.Duration }{
		{time.Second, 2 * time.Second, time.Second, 2 * time.Second},
		{2 * time.Second, time.Second, 2 * time.Second, 2 * time.Second},
		{0, time.Second, time.Millisecond, time.Second},
	} {
		b := Backoff(c.lo, c.hi)
		for range 1000 {
			if d := b.NextBackOff(); d < c.wantLo || d > c.wantHi {
				t.Fatalf("Backoff(%v, %v) gave %v, want within [%v, %v]", c.lo, c.hi, d, c.wantLo, c.wantHi)
			}
		}
	}
}
