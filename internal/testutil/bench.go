package testutil

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Timed is one of the ways a benchmark compares (gpupass's against the
// peer tool's), timed once a round.
type Timed struct {
	// Name prefixes its metrics: NAME-p50-ms, NAME-p95-ms.
	Name string
	// Run does round i and returns how long the part it times took.
	Run func(i int) time.Duration
}

// Alternate runs each of ways once a round, in turn, for at least ten
// rounds (b.N when more), so that the machine's load falls on each alike,
// and reports each one's p50 and p95 in milliseconds; ns/op, which says
// nothing here, is reported as 0.
func Alternate(b *testing.B, ways ...Timed) {
	b.Helper()
	n := max(10, b.N)
	took := make([][]time.Duration, len(ways))
	for i := range n {
		for w, way := range ways {
			took[w] = append(took[w], way.Run(i))
		}
	}
	for w, way := range ways {
		b.ReportMetric(Percentile(took[w], 0.5), way.Name+"-p50-ms")
		b.ReportMetric(Percentile(took[w], 0.95), way.Name+"-p95-ms")
	}
	b.ReportMetric(0, "ns/op")
}

// Percentile is the q-quantile (0..1) of d, nearest rank, in
// milliseconds; 0 for none.
func Percentile(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1)+0.5)]) / float64(time.Millisecond)
}

// CPUTime is this process's user+system CPU time. Benchmarks report CPU
// per operation besides wall time: on a shared machine the wall time
// mostly measures the other tenants; the CPU cost does not.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Load1 is the machine's one-minute load average (-1 where unknown), for
// benchmarks to print beside their figures.
func Load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b) + " x")[0], 64)
	if err != nil {
		return -1
	}
	return f
}
