package testutil_test

import (
	"os"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// TestPrereqsMissing: a tool is found on PATH or in /usr/sbin; the first
// one found in neither is named with what installs it; root is asked for
// only when the component needs it.
func TestPrereqsMissing(t *testing.T) {
	// Only /bin on PATH: a daemon in /usr/sbin is still found there.
	t.Setenv("PATH", "/bin")
	sbin, err := os.ReadDir("/usr/sbin")
	if err != nil || len(sbin) == 0 {
		t.Fatalf("no /usr/sbin to look in: %v", err)
	}
	root := "the component needs root"
	wantRoot := ""
	if os.Geteuid() != 0 {
		wantRoot = root
	}
	for _, tc := range []struct {
		name string
		p    testutil.Prereqs
		want string
	}{
		{"all there", testutil.Prereqs{Tools: []string{"sh", sbin[0].Name()}}, ""},
		{"a missing tool, named with its installer", testutil.Prereqs{Tools: []string{"sh", "gpupass-no-such-tool", "also-missing"}, Install: "setup.d/99-x.sh installs x"},
			"gpupass-no-such-tool not installed (setup.d/99-x.sh installs x)"},
		{"root", testutil.Prereqs{Root: root, Tools: []string{"sh"}}, wantRoot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Missing(); got != tc.want {
				t.Errorf("Missing() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPercentile: nearest rank, in milliseconds, of unsorted input.
func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	for _, tc := range []struct {
		d    []time.Duration
		q    float64
		want float64
	}{
		{nil, 0.5, 0},
		{ms(7), 0.95, 7},
		{ms(30, 10, 20), 0.5, 20},
		{ms(10, 1, 2, 3, 4, 5, 6, 7, 8, 9), 0.95, 10},
		{ms(10, 1, 2, 3, 4, 5, 6, 7, 8, 9), 0.5, 6},
	} {
		if got := testutil.Percentile(tc.d, tc.q); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.d, tc.q, got, tc.want)
		}
	}
}
