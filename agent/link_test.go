package agent

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestLinkCheck: the run report's check of the link measured at gang
// start passes at or above the declared figure, records a shortfall as a
// warning below it (or when nothing could be measured), and fails only
// under --require-bandwidth, each saying both figures.
func TestLinkCheck(t *testing.T) {
	t.Parallel()
	measured := func(busbw, declared float64, required bool, errText string) *conformance.Link {
		l := &conformance.Link{Backend: "gloo", Ranks: 2, Bytes: linkBytes, BusBWGbps: busbw, DeclaredGbps: declared, Required: required,
			MasterAddr: "127.0.0.1", Error: errText}
		l.Shortfall = l.DeclaredGbps > 0 && (l.Error != "" || l.BusBWGbps < l.DeclaredGbps)
		return l
	}
	byJob := func(l *conformance.Link, inCommand bool) *conformance.Link {
		l.MeasuredBy, l.InCommand, l.Torch = conformance.LinkByJob, inCommand, "1.13.0a0"
		return l
	}
	for _, tc := range []struct {
		name   string
		link   *conformance.Link
		status conformance.Status
		want   []string
	}{
		{"written by a step of the rank's job", byJob(measured(40, 25, false, ""), false), conformance.Pass,
			[]string{"40 Gbit/s bus bandwidth", "measured by a step of the rank's job before its command: the figure the job wrote"}},
		{"written by the rank's command", byJob(measured(4.5, 25, false, ""), true), conformance.Warn,
			[]string{"measured by the command's own Python once it imported torch 1.13.0a0: the figure the rank's job wrote", "below the declared 25"}},
		{"above the declared figure", measured(40, 25, true, ""), conformance.Pass, []string{"40 Gbit/s bus bandwidth", ">= 25 Gbit/s"}},
		{"nothing declared", measured(4.5, 0, true, ""), conformance.Pass, []string{"4.5 Gbit/s"}},
		{"a shortfall is recorded", measured(4.5, 100000, false, ""), conformance.Warn,
			[]string{"measured 4.5 Gbit/s, below the declared 100000 Gbit/s", "recorded as a shortfall"}},
		{"a shortfall with --require-bandwidth fails", measured(4.5, 100000, true, ""), conformance.Fail,
			[]string{"measured 4.5 Gbit/s, below the declared 100000 Gbit/s (--require-bandwidth)"}},
		{"not measured where declared", measured(0, 25, false, "no torch"), conformance.Warn, []string{"not measured (no torch), the spec declares 25 Gbit/s"}},
		{"not measured, nothing declared", measured(0, 0, true, "no torch"), conformance.Skip, []string{"no torch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := linkCheckOf(tc.link)
			all := c.Expected + " | " + c.Actual + " | " + c.Message
			if c.Name != linkCheck || c.Status != tc.status {
				t.Errorf("check %s %s (%s), want %s", c.Name, c.Status, all, tc.status)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("check says %q, want %q in it", all, w)
				}
			}
		})
	}
}

// TestLinkEvent: the run log's line for the link a node's agent measured
// says the figure and the declared one, and a shortfall is a WARN that
// says it was recorded; a link not measured says why.
func TestLinkEvent(t *testing.T) {
	t.Parallel()
	link := func(busbw, declared float64, errText string) conformance.Check {
		l := &conformance.Link{Backend: "gloo", Ranks: 2, Bytes: linkBytes, BusBWGbps: busbw, DeclaredGbps: declared,
			MasterAddr: "127.0.0.1", Error: errText, MeasuredBy: conformance.LinkByAgent}
		l.Shortfall = l.DeclaredGbps > 0 && (l.Error != "" || l.BusBWGbps < l.DeclaredGbps)
		return linkCheckOf(l)
	}
	for _, tc := range []struct {
		name  string
		check conformance.Check
		level events.Level
		want  []string
	}{
		{"above the declared figure", link(40, 25, ""), events.Info,
			[]string{"link measured by this node's agent: 40 Gbit/s bus bandwidth (all-reduce of 32 MiB over gloo across 2 ranks", "declared >= 25 Gbit/s"}},
		{"a shortfall", link(7, 25, ""), events.Warn,
			[]string{"link measured by this node's agent: 7 Gbit/s", "declared >= 25 Gbit/s", "measured 7 Gbit/s, below the declared 25 Gbit/s: recorded as a shortfall"}},
		{"a shortfall with --require-bandwidth", linkCheckOf(&conformance.Link{Backend: "gloo", Ranks: 2, Bytes: linkBytes, BusBWGbps: 7, DeclaredGbps: 25,
			Required: true, Shortfall: true, MasterAddr: "127.0.0.1"}), events.Error,
			[]string{"link measured by this node's agent: 7 Gbit/s", "measured 7 Gbit/s, below the declared 25 Gbit/s (--require-bandwidth)"}},
		{"not measured, nothing declared", link(0, 0, "no torch"), events.Info, []string{"link not measured by this node's agent: no torch"}},
		{"not measured where declared", link(0, 25, "no torch"), events.Warn,
			[]string{"link not measured by this node's agent; declared >= 25 Gbit/s", "not measured (no torch), the spec declares 25 Gbit/s: recorded as a shortfall"}},
	} {
		level, comp, msg, fields := linkEvent(tc.check)
		if level != tc.level || comp != events.RuntimeInit || fields["check"] != linkCheck {
			t.Errorf("%s: %s %s %q %v; want level %s, runtime-init, check %s", tc.name, level, comp, msg, fields, tc.level, linkCheck)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q, want %q in it", tc.name, msg, w)
			}
		}
	}
}

// standsForNode is a cluster node as far as measureLink looks: set.
type standsForNode struct{ Node }

// TestLinkNotMeasuredForClusterNodes (issue #34): a Slurm or Kubernetes
// node's rank runs in the cluster's job, away from the agent that stands
// for it. The all-reduce is not run from the agent's host, which would
// measure that host's network, or wait out its 90 s timeout for peers it
// cannot reach (a Kubernetes gang's rank 0 at pod-ip.invalid): it is
// recorded as not measured, at once.
func TestLinkNotMeasuredForClusterNodes(t *testing.T) {
	t.Parallel()
	o := &Options{Python: "/bin/false"}
	o.StandFor(standsForNode{})
	a := &Agent{o: o, log: slog.New(slog.DiscardHandler)}
	sp := &spec.Spec{}
	sp.Resources.Network.BandwidthGbps = 100
	start := time.Now()
	l := a.measureLink(context.Background(), &rendezvous.Gang{Nodes: 2, NodeRank: 1, LocalRanks: 1, MasterAddr: rendezvous.PodAddress, MasterPort: 29500}, sp, true)
	if !strings.HasPrefix(l.Error, "not measured: this node's rank runs as its cluster's job") || !l.Shortfall || l.BusBWGbps != 0 {
		t.Errorf("link of a cluster node's rank: error %q, shortfall %v, %g Gbit/s; want not measured, a shortfall of the declared 100", l.Error, l.Shortfall, l.BusBWGbps)
	}
	if c := linkCheckOf(l); c.Status != conformance.Fail {
		t.Errorf("with --require-bandwidth the check is %s (%s), want a failure", c.Status, c.Message)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %s: want no measurement attempted", took)
	}
}

// linkAgent is an agent as far as measureLink looks: the node's Python
// and its one warm measurement process.
func linkAgent(t *testing.T, py string) *Agent {
	a := &Agent{o: &Options{Python: py}, log: slog.New(slog.DiscardHandler)}
	a.link = newLinkWorkers(py, func() bool { return a.runs.Load() == 0 }, a.log)
	a.link.poll = 10 * time.Millisecond
	a.link.refill()
	t.Cleanup(a.link.stop)
	return a
}

// measureGang measures the link as both ranks of a gang of two nodes at
// once, rank i on agents[i], at a free loopback port.
func measureGang(t *testing.T, agents [2]*Agent) [2]*conformance.Link {
	t.Helper()
	port := testutil.FreePort(t)
	var (
		got [2]*conformance.Link
		wg  sync.WaitGroup
	)
	for rank, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := &rendezvous.Gang{Nodes: 2, NodeRank: rank, LocalRanks: 1, MasterAddr: "127.0.0.1", MasterPort: port}
			got[rank] = a.measureLink(context.Background(), g, &spec.Spec{}, false)
		}()
	}
	wg.Wait()
	for rank, l := range got {
		// What is measured is the same however the process started: 2
		// ranks, 32 MiB, median of 5, the slowest rank's time, busbw
		// by nccl-tests' formula (= algbw for 2 ranks).
		if l.Error != "" || l.Ranks != 2 || l.Bytes != 32<<20 || l.Iterations != 5 || l.Backend != "gloo" || !(l.Seconds > 0) ||
			l.BusBWGbps != l.AlgBWGbps || l.Seconds != got[1-rank].Seconds || l.Formula != BusBWFormula {
			t.Errorf("rank %d's link: %+v; want 2 ranks, 32 MiB, 5 iterations over gloo, the slowest rank's time on both", rank, *l)
		}
	}
	return got
}

// waitWarm waits for a's warm measurement process and returns its pid.
func waitWarm(t *testing.T, a *Agent) int {
	t.Helper()
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if pid := a.link.pid(); pid != 0 {
			return pid
		}
	}
	t.Fatal("no warm link measurement process after a minute")
	return 0
}

// reaped waits (a little) for pid to have been reaped.
func reaped(pid int) bool {
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
	}
	return false
}

// TestLinkWarmWorker (issue #34's bench): an agent that runs gang ranks
// itself keeps its link measurement process started ahead of the gang.
// A gang's measurement uses it (recorded as warm) and measures what a
// cold one does; it is used once and replaced by a fresh process; a warm
// process that died falls back to a cold start, recorded as cold, next
// to a warm rank; stopping the agent's pool leaves no process behind.
func TestLinkWarmWorker(t *testing.T) {
	t.Parallel()
	py := defaultLinkPython
	if err := exec.Command(py, "-I", "-c", "import torch").Run(); err != nil {
		testutil.Missing(t, "%s with torch (python3-torch)", py)
	}
	a0, a1 := linkAgent(t, py), linkAgent(t, py)
	p0, p1 := waitWarm(t, a0), waitWarm(t, a1)

	got := measureGang(t, [2]*Agent{a0, a1})
	for rank, l := range got {
		if !l.Warm {
			t.Errorf("rank %d measured with a cold process; want the agent's warm one", rank)
		}
		if c := linkCheckOf(l); l.MeasuredBy != conformance.LinkByAgent || strings.Contains(c.Actual, "job") {
			t.Errorf("rank %d: measured_by %q, check %q; want %q and no word of a job", rank, l.MeasuredBy, c.Actual, conformance.LinkByAgent)
		}
	}
	if !reaped(p0) || !reaped(p1) {
		t.Errorf("the warm processes %d and %d are still there after their gang: want each used once", p0, p1)
	}
	q0 := waitWarm(t, a0)
	if q0 == p0 {
		t.Fatalf("the warm process after the gang is %d, the one the gang used", q0)
	}

	// Rank 0's warm process dies before the next gang: a cold start
	// takes its place, recorded so, and measures with rank 1's warm one.
	if err := syscall.Kill(q0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !reaped(q0) {
		t.Fatalf("killed warm process %d still there", q0)
	}
	waitWarm(t, a1)
	got = measureGang(t, [2]*Agent{a0, a1})
	if got[0].Warm || !got[1].Warm {
		t.Errorf("warm: rank 0 %v, rank 1 %v; want rank 0 cold (its warm process died), rank 1 warm", got[0].Warm, got[1].Warm)
	}

	// Stopping the pool (the agent stopping) ends its warm process.
	r1 := waitWarm(t, a1)
	a1.link.stop()
	if !reaped(r1) {
		t.Errorf("warm link measurement process %d still running after the agent's pool stopped", r1)
	}
	if a1.link.refill(); a1.link.pid() != 0 {
		t.Error("a stopped pool started a warm process again")
	}
}

// TestReadLinkResult (issue #34): the result names where the ranks met,
// as the measurement found it in its own variables: a Kubernetes rank 0's
// pod IP, which the agent only knew as the broker's placeholder; an
// address no rank could have met at is refused, not signed.
func TestReadLinkResult(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, out, wantAddr, wantErr string
	}{
		{name: "pod IP", out: `{"backend": "gloo", "ranks": 2, "seconds": 0.05, "busbw_gbps": 5.4, "master_addr": "10.244.0.7"}`, wantAddr: "10.244.0.7"},
		{name: "older script", out: `{"backend": "gloo", "ranks": 2, "seconds": 0.05, "busbw_gbps": 5.4}`, wantAddr: rendezvous.PodAddress},
		{name: "bad address", out: `{"backend": "gloo", "ranks": 2, "seconds": 0.05, "busbw_gbps": 5.4, "master_addr": "fe80::1%eth0"}`,
			wantAddr: rendezvous.PodAddress, wantErr: "the measurement's master_addr: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := &conformance.Link{Ranks: 2, MasterAddr: rendezvous.PodAddress}
			err := readLinkResult(l, "warm-up\n"+tc.out+"\n")
			if l.MasterAddr != tc.wantAddr || (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("master_addr %q, err %v; want %q, error %q", l.MasterAddr, err, tc.wantAddr, tc.wantErr)
			}
		})
	}
}
