package promtest

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestBuckets: the matching samples' buckets are summed, +Inf holds the
// count (once, though the text parser lists it as a bucket too), and other
// label values are left out.
func TestBuckets(t *testing.T) {
	fams := Parse(t, []byte(`# TYPE d histogram
d_bucket{p="a",code="ok",le="0.1"} 3
d_bucket{p="a",code="ok",le="1"} 5
d_bucket{p="a",code="ok",le="+Inf"} 6
d_sum{p="a",code="ok"} 2
d_count{p="a",code="ok"} 6
d_bucket{p="a",code="unavailable",le="0.1"} 0
d_bucket{p="a",code="unavailable",le="1"} 1
d_bucket{p="a",code="unavailable",le="+Inf"} 1
d_sum{p="a",code="unavailable"} 0.5
d_count{p="a",code="unavailable"} 1
d_bucket{p="b",code="ok",le="0.1"} 7
d_bucket{p="b",code="ok",le="1"} 7
d_bucket{p="b",code="ok",le="+Inf"} 7
d_sum{p="b",code="ok"} 0.1
d_count{p="b",code="ok"} 7
`))
	want := map[float64]uint64{0.1: 3, 1: 6, math.Inf(1): 7}
	if diff := cmp.Diff(want, Buckets(fams, "d", "p=a")); diff != "" {
		t.Errorf("Buckets(p=a) (-want +got):\n%s", diff)
	}
	if got := Buckets(fams, "d", "p=c"); len(got) != 0 {
		t.Errorf("Buckets(p=c) = %v, want none", got)
	}
	if n, _ := Value(fams, "d", "p=b"); n != 7 {
		t.Errorf("Value(p=b) = %v, want the count 7", n)
	}
}
