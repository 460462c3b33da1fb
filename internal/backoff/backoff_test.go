package backoff

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestJitterAndCap: two back-offs (two agents after the same broker
// restart) give different schedules, every delay stays within [Min, Max],
// the cap is reached, and Reset starts over from Min.
func TestJitterAndCap(t *testing.T) {
	t.Parallel()
	caps := []struct{ min, max time.Duration }{
		{500 * time.Millisecond, 30 * time.Second}, // enroll
		{100 * time.Millisecond, 5 * time.Second},  // state edges, run reports
		{100 * time.Millisecond, 10 * time.Second}, // log uploads
	}
	for _, c := range caps {
		a, b := New(c.min, c.max), New(c.min, c.max)
		var sa, sb []time.Duration
		for range 60 {
			sa, sb = append(sa, a.Next()), append(sb, b.Next())
		}
		if slices.Equal(sa, sb) {
			t.Errorf("%v..%v: two back-offs gave the same schedule %v: no jitter", c.min, c.max, sa)
		}
		if sa[0] > 3*c.min || sb[0] > 3*c.min {
			t.Errorf("%v..%v: first delays %v, %v; want at most 3×Min", c.min, c.max, sa[0], sb[0])
		}
		for _, d := range append(sa, sb...) {
			if d < c.min || d > c.max {
				t.Fatalf("%v..%v: delay %v outside [Min, Max]", c.min, c.max, d)
			}
		}
		if top := slices.Max(sa); top < c.max/2 {
			t.Errorf("%v..%v: 60 delays never came near the cap (max %v)", c.min, c.max, top)
		}
		a.Reset()
		if d := a.Next(); d > 3*c.min {
			t.Errorf("%v..%v: after Reset %v, want at most 3×Min", c.min, c.max, d)
		}
	}
}

// TestBounds: the extremes of the draw give exactly Min and the cap.
func TestBounds(t *testing.T) {
	t.Parallel()
	lowest := &Backoff{Min: time.Second, Max: 10 * time.Second, Int64N: func(int64) int64 { return 0 }}
	for range 10 {
		if d := lowest.Next(); d != time.Second {
			t.Fatalf("lowest draw gave %v, want Min", d)
		}
	}
	highest := &Backoff{Min: time.Second, Max: 10 * time.Second, Int64N: func(n int64) int64 { return n - 1 }}
	var got []time.Duration
	for range 5 {
		got = append(got, highest.Next())
	}
	if want := []time.Duration{3 * time.Second, 9 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("highest draws gave %v, want %v", got, want)
	}
	seeded := func() *Backoff {
		r := rand.New(rand.NewPCG(1, 2))
		return &Backoff{Min: time.Millisecond, Max: time.Second, Int64N: r.Int64N}
	}
	x, y := seeded(), seeded()
	for range 20 {
		if x.Next() != y.Next() {
			t.Fatal("the same source must give the same schedule")
		}
	}
	if d := (&Backoff{Min: 2 * time.Second, Max: time.Second}).Next(); d != 2*time.Second {
		t.Errorf("Max below Min gave %v, want Min", d)
	}
}
