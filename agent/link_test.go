package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
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
	for _, tc := range []struct {
		name   string
		link   *conformance.Link
		status conformance.Status
		want   []string
	}{
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
