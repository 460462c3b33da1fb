package editdist

import "testing"

func TestDistance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"kitten", "sitting", 3}, {"BROKR_URL", "BROKER_URL", 1},
		{"flaw", "lawn", 2}, {"", "abc", 3}, {string(make([]byte, 65)), "a", Max},
		// A swap of adjacent letters is one edit (issue #32: GPUPASS_SPCE).
		{"GPUPASS_SPCE", "GPUPASS_SPEC", 1}, {"ab", "ba", 1}, {"abcd", "badc", 2}, {"ca", "abc", 3},
	} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
