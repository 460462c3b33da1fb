package testutil

import (
	"fmt"
	"math/rand/v2"
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
	// Phase, when above 0, is a pause before each round, drawn uniformly
	// from [0, Phase) and not timed. A way whose start waits for a
	// periodic event (slurmctld starts batch jobs in a pass once a
	// second) would otherwise meet it at the same phase every round,
	// since the rounds before it took about the same time: its figure
	// would say where that phase fell, not what the wait costs.
	Phase time.Duration
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
			if way.Phase > 0 {
				time.Sleep(rand.N(way.Phase))
			}
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

// clockTick is the kernel's USER_HZ, the unit of /proc's CPU times: 100
// on every Linux architecture Go supports (sysconf(_SC_CLK_TCK) reads the
// same constant from the kernel's ABI).
const clockTick = 10 * time.Millisecond

// TreeCPU is the user+system CPU time of process pid and of every live
// process below it, plus what its children that have ended and been
// waited for used (the kernel's cutime and cstime), read from /proc.
// Benchmarks read it before and after a measured stretch to say how much
// of the machine another process (a broker, the PostgreSQL server and
// its backends) took for the load it served.
func TreeCPU(pid int) (time.Duration, error) {
	_, cpu, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	// ppid of every live process, to walk the tree down from pid.
	children := map[int][]int{}
	own := map[int]time.Duration{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		pp, c, err := procStat(p)
		if err != nil {
			continue // ended while listed
		}
		children[pp] = append(children[pp], p)
		own[p] = c
	}
	total := cpu
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		total += own[queue[0]]
		queue = append(queue, children[queue[0]]...)
	}
	return total, nil
}

// procStat reads pid's parent and its CPU time (utime+stime, and
// cutime+cstime of its waited-for children) from /proc/PID/stat.
func procStat(pid int) (ppid int, cpu time.Duration, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields that follow start after its last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no ')' in %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields after the name, want 15 or more", pid, len(f))
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: ppid %q: %w", pid, f[1], err)
	}
	var ticks int64
	for _, v := range f[11:15] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: CPU time %q: %w", pid, v, err)
		}
		ticks += n
	}
	return ppid, time.Duration(ticks) * clockTick, nil
}
