//go:build e2e

package kubernetes_test

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	brokerclient "github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// gangLinkRun is what the link subtests need of TestE2EKubernetesGang:
// its stack, and its first run (kgang), whose pods measured the link
// before training, with rank 0's pod IP as the training saw it.
type gangLinkRun struct {
	rc *brokerclient.RunClients
	gp func(args ...string) *exec.Cmd
	py string
	sp string
	// run is kgang's id and podIP rank 0's pod IP, the training's
	// MASTER_ADDR ("" when that subtest failed before reading them).
	run, podIP    string
	bothCertified func(*testing.T)
}

// kubeGangLink is TestE2EKubernetesGang's link subtests (issue #34):
// each rank's pod measures the link before its training command, at the
// gang's rendezvous (rank 0's pod IP), and every rank's signed run report
// carries the figure, the declared one beside it; --require-bandwidth
// with a declared figure above the measured one fails the run naming
// both before any training line, on every rank.
func kubeGangLink(t *testing.T, ctx context.Context, g *gangLinkRun) {
	var measured float64
	t.Run("every rank's signed report carries the link measured in its pod", func(t *testing.T) {
		if g.run == "" || g.podIP == "" {
			t.Fatal("the gang's first run left no run and rank 0 pod IP to look at")
		}
		links := upstack.RankLinks(t, ctx, g.rc, g.run)
		if len(links) != 2 {
			t.Fatalf("GetRunEvidence has %d rank report(s), want 2", len(links))
		}
		figures := map[int]float64{}
		for rank, r := range links {
			l := r.Link
			if l == nil {
				t.Errorf("rank %d's signed report (%s) records no link", rank, r.AllocID)
				continue
			}
			t.Logf("rank %d (%s): %g Gbit/s bus bandwidth over %s at %s, declared %g, shortfall %v, report simulated %v, error %q",
				rank, r.AllocID, l.BusBWGbps, l.Backend, l.MasterAddr, l.DeclaredGbps, l.Shortfall, r.Simulated, l.Error)
			// The node is simulated (no GPU) and says so; the link
			// figure is measured, between two pods on this machine.
			// The command is a Python script: its own Python measured,
			// once it had imported torch (no second import of torch),
			// and the report says the job wrote the figure.
			if l.Error != "" || !(l.BusBWGbps > 0) || l.Backend != "gloo" || l.Ranks != 2 || l.MasterAddr != g.podIP || l.DeclaredGbps != 25 ||
				l.Shortfall != (l.BusBWGbps < 25) || l.Simulated || !r.Simulated || !l.InCommand || l.Torch == "" || l.MeasuredBy != "job" {
				t.Errorf("rank %d's link: %+v (report simulated %v); want measured by gloo across 2 ranks at rank 0's pod IP %s, 25 declared, an honest shortfall, by the command's Python, measured_by job",
					rank, *l, r.Simulated, g.podIP)
			}
			checked := false
			for _, c := range r.Checks {
				checked = checked || c.Name == "network.allreduce_gbps" && (c.Status == "pass" || c.Status == "warn")
			}
			if !checked {
				t.Errorf("rank %d's report has no measured network.allreduce_gbps check: %+v", rank, r.Checks)
			}
			figures[rank] = l.BusBWGbps
		}
		if figures[0] != figures[1] {
			t.Errorf("rank 0 measured %g Gbit/s, rank 1 %g: every rank signs the slowest rank's time", figures[0], figures[1])
		}
		measured = figures[0]
		// The agent says so in each rank's log when it reads the result;
		// what the measurement adds to the gang's start is logged.
		for rank, id := range []string{g.run, g.run + "-r1"} {
			log, _ := upstack.RunLog(t, ctx, g.rc, id)
			running, noted, trained := tsOf(log, `: Running"`), tsOf(log, "link measured by the gang's job"), tsOf(log, "backend gloo on cpu, master ")
			if noted.IsZero() {
				t.Errorf("rank %d's log has no note of the link measured:\n%s", rank, upstack.Tail(log, 3000))
			}
			if !running.IsZero() && !noted.IsZero() && !trained.IsZero() {
				t.Logf("rank %d: pod seen running → link noted %s, → first training line %s",
					rank, noted.Sub(running).Round(time.Millisecond), trained.Sub(running).Round(time.Millisecond))
			}
		}
		// The audit of this run, every rank's report as signed again
		// with the figure, was verified by the subtest that made it.
	})

	t.Run("--require-bandwidth below the declared figure fails every pod before training", func(t *testing.T) {
		if measured == 0 {
			t.Fatal("the subtest before signed no link figure to compare with")
		}
		if measured >= 25 {
			t.Skipf("the link measured %g Gbit/s here, not below examples/ddp's declared 25", measured)
		}
		g.bothCertified(t)
		out, err := g.gp("train", "--spec", g.sp, "--region", "k8s-gang", "--workdir", "examples/ddp",
			"--name", "klinkreq", "--require-bandwidth", "--follow", "--", g.py, "train_ddp.py", "--steps", "5", "--timeout", "120").CombinedOutput()
		run := upstack.RunNamed(ctx, g.rc, "klinkreq")
		if run == nil {
			t.Fatalf("train --follow: %v\n%s", err, upstack.Tail(string(out), 4000))
		}
		// Every rank's pod checks the figure (the slowest rank's, the
		// same on each) and exits 3 before its command; the broker may
		// stop a rank once another's failure ended the run.
		upstack.CheckBandwidthRefused(t, ctx, g.rc, run, out, err, func(log string) bool {
			return strings.Contains(log, "backend gloo on cpu, master ") || strings.Contains(log, `"component":"trainer"`)
		})
	})
}

var recordTS = regexp.MustCompile(`"ts":"([^"]+)"`)

// tsOf is the time of the first record of log that contains what.
func tsOf(log, what string) time.Time {
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, what) {
			continue
		}
		if m := recordTS.FindStringSubmatch(l); m != nil {
			if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				return ts
			}
		}
	}
	return time.Time{}
}
