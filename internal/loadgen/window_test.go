package loadgen

import (
	"testing"
	"time"
)

// TestSentWithin: the beats of a window keep their own latencies when the
// whole list is summarized afterwards. (summarize sorts in place: a window
// read after it took the window's ranks of the sorted list, and a first
// version of the fleet bench printed p99 4 ms where 220 ms was measured.)
func TestSentWithin(t *testing.T) {
	t0 := time.Now()
	at := []time.Time{t0, t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(3 * time.Second)}
	ds := []time.Duration{5 * time.Millisecond, 900 * time.Millisecond, 800 * time.Millisecond, 1 * time.Millisecond}
	got := sentWithin(ds, at, t0.Add(time.Second), t0.Add(3*time.Second))
	all := summarize(ds)
	win := summarize(got)
	if win.N != 2 || win.P50 != 800 || win.Max != 900 {
		t.Errorf("window: %+v, want the two beats sent in it (800 and 900 ms)", win)
	}
	if all.N != 4 || all.Max != 900 {
		t.Errorf("all: %+v", all)
	}
}
