package executor_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/testutil"
)

// BenchmarkChattyEvents pushes output lines of a `yes`-like command
// through the executor into a real spool and reports events per second
// end to end (process start to the last record spooled).
func BenchmarkChattyEvents(b *testing.B) {
	const lines = 500000
	cmd := fmt.Sprintf("yes 'trainer: step 123 loss 0.482913 lr 0.05 throughput 1843.2 samples/s' | head -n %d", lines)
	var total time.Duration
	var events uint64
	for i := 0; i < b.N; i++ {
		sp, err := spool.Open(filepath.Join(b.TempDir(), "spool"), spool.Options{})
		if err != nil {
			b.Fatal(err)
		}
		x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
		start := time.Now()
		res, err := x.Execute(context.Background(), executor.Job{AllocID: "alloc-bench", WorkRoot: b.TempDir(), Command: []string{"sh", "-c", cmd}}, sp)
		if err != nil || res.State != executor.Succeeded {
			b.Fatalf("%+v %v", res, err)
		}
		if err := sp.Sync(); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		events += res.LastSeq
		sp.Close()
	}
	b.ReportMetric(float64(events)/total.Seconds(), "events/s")
}

// BenchmarkChattyPeer is the floor the executor is measured against: the
// same command with its output redirected to a file by the shell.
func BenchmarkChattyPeer(b *testing.B) {
	const lines = 500000
	var total time.Duration
	for i := 0; i < b.N; i++ {
		out := filepath.Join(b.TempDir(), "out")
		start := time.Now()
		c := exec.Command("sh", "-c", fmt.Sprintf("yes 'trainer: step 123 loss 0.482913 lr 0.05 throughput 1843.2 samples/s' | head -n %d > %s", lines, out))
		if err := c.Run(); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(lines*b.N)/total.Seconds(), "events/s")
}

// firstLine notes when the first stdout event reaches the spool.
type firstLine struct {
	*spool.Spool
	once sync.Once
	at   time.Time
}

func (f *firstLine) Append(recs ...spool.Record) (uint64, uint64, error) {
	first, last, err := f.Spool.Append(recs...)
	for _, r := range recs {
		if e, derr := executor.DecodeEvent(r); derr == nil && e.Component == "stdout" {
			f.once.Do(func() { f.at = time.Now() })
			break
		}
	}
	return first, last, err
}

// BenchmarkFirstLine measures Execute start → the trivial command's first
// output line spooled, and reports p50/p95 over b.N runs (run it with
// -benchtime 200x or more).
func BenchmarkFirstLine(b *testing.B) {
	var lat []time.Duration
	dir := b.TempDir()
	for i := 0; i < b.N; i++ {
		sp, err := spool.Open(filepath.Join(dir, "spool-"+strconv.Itoa(i)), spool.Options{})
		if err != nil {
			b.Fatal(err)
		}
		fl := &firstLine{Spool: sp}
		x := &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}
		start := time.Now()
		res, err := x.Execute(context.Background(), executor.Job{AllocID: "alloc-" + strconv.Itoa(i), WorkRoot: dir, Command: []string{"echo", "hello"}}, fl)
		if err != nil || res.State != executor.Succeeded || fl.at.IsZero() {
			b.Fatalf("%+v %v", res, err)
		}
		lat = append(lat, fl.at.Sub(start))
		sp.Close()
	}
	b.ReportMetric(testutil.Percentile(lat, 0.50), "p50-ms")
	b.ReportMetric(testutil.Percentile(lat, 0.95), "p95-ms")
}

// BenchmarkFirstLinePeer: the same command started by os/exec, to its
// first byte of output: the cost of a bare fork/exec on this machine.
func BenchmarkFirstLinePeer(b *testing.B) {
	var lat []time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c := exec.Command("echo", "hello")
		out, err := c.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := out.Read(buf); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		c.Wait()
	}
	b.ReportMetric(testutil.Percentile(lat, 0.50), "p50-ms")
	b.ReportMetric(testutil.Percentile(lat, 0.95), "p95-ms")
}
