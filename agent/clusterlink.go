package agent

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
)

// On a cluster (Slurm) a rank runs as the cluster's job on its node, away
// from the agent that stands for the node: the link is measured there, by
// a step of the gang's own job at the gang's rendezvous before the
// command (executor.LinkStep), with the same script, parameters and
// isolated node Python as on a local agent. The figure exists only once
// the job runs, after runtime-init signed the rank's run report, so that
// report says the link is not measured yet, and the step's result
// replaces it with a report signed again with the figure (the broker
// keeps one report per rank, the last one sent while the run runs).
// --require-bandwidth is enforced by the step itself: below the declared
// figure the job ends before the command starts, every rank alike (the
// figure is the slowest rank's), and the run's reason says both figures.

// linkInJob is a runner that runs a gang rank's link step in the rank's
// own job (executor.Attempt.Link).
type linkInJob interface{ RunsLinkStep() bool }

// measuresLinkInJob says whether this agent's ranks measure the link in
// their job: a cluster node whose runner takes the step.
func (a *Agent) measuresLinkInJob() bool {
	if a.o.standsFor == nil {
		return false
	}
	r, ok := a.o.standsFor.Runner().(linkInJob)
	return ok && r.RunsLinkStep()
}

// linkPending is what the report runtime-init signs says of a link the
// rank's job is to measure.
const linkPending = "not measured yet: the gang's own job measures it on this node before its command starts, and this rank's run report is then signed again with the figure"

// pendingLink is the link of the report runtime-init signs on a cluster
// rank: not measured yet, and no shortfall yet (the job's step decides).
func pendingLink(g *rendezvous.Gang, sp *spec.Spec, required bool) *conformance.Link {
	return &conformance.Link{Ranks: g.Nodes, Bytes: linkBytes, Iterations: linkIterations, Formula: BusBWFormula,
		DeclaredGbps: sp.Resources.Network.BandwidthGbps, Required: required, MasterAddr: g.MasterAddr, Error: linkPending,
		MeasuredBy: conformance.LinkByJob}
}

// linkStep is the step of the rank's job that measures the link, and
// signs sr again with the figure once it has (sent through sink, when
// there is a broker to keep it).
func (a *Agent) linkStep(as *Assignment, sr *SignedReport, sink RunReportSink) *executor.LinkStep {
	py := a.o.Python
	if py == "" {
		py = defaultLinkPython
	}
	l := *sr.Report.Link
	s := &executor.LinkStep{Python: py, Script: allreduceScript, DeclaredGbps: l.DeclaredGbps,
		Args: []string{strconv.Itoa(linkBytes), strconv.Itoa(linkIterations), strconv.Itoa(int(linkTimeout / time.Second))}}
	if l.Required && l.DeclaredGbps > 0 {
		s.MinGbps = l.DeclaredGbps
	}
	s.Measured = func(stdout []byte, why error) (string, error) {
		got := l
		got.Error = ""
		if why != nil {
			got.Error = "not measured: " + why.Error()
		} else if err := readLinkResult(&got, string(stdout)); err != nil {
			got.Error = err.Error()
		}
		got.Shortfall = got.DeclaredGbps > 0 && (got.Error != "" || got.BusBWGbps < got.DeclaredGbps)
		check := linkCheckOf(&got)
		a.log.Info("link measured in the gang's job", "alloc", as.AllocID, "busbw_gbps", got.BusBWGbps, "declared_gbps", got.DeclaredGbps,
			"backend", got.Backend, "master_addr", got.MasterAddr, "error", got.Error)
		var failed error
		if check.Status == conformance.Fail {
			failed = fmt.Errorf("%s: %s", linkCheck, check.Message)
		}
		what := fmt.Sprintf("link measured by the gang's job on this node: %s", check.Actual)
		if got.Error != "" {
			what = "link " + got.Error
		}
		if check.Status == conformance.Warn {
			what += fmt.Sprintf("; declared %s: %s", check.Expected, check.Message)
		}
		signed, err := a.amendLink(sr, &got, check)
		if err != nil {
			return "", fmt.Errorf("%s; signing the run report with it: %w", what, err)
		}
		if sink == nil {
			return what, failed
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := submitWithRetry(ctx, sink, as, signed, a.log); err != nil {
			return "", fmt.Errorf("%s; sending the run report signed with it: %w", what, err)
		}
		return what + "; this rank's run report, signed again with it, replaced the one sent at runtime-init", failed
	}
	return s
}

// followLink is RunLoop.FollowLink for this agent: the report the
// ledger kept is taken only under this agent's own signature (the
// ledger is the agent's, but a report it would sign again must be one it
// signed), and only while its link is still the pending one.
func (a *Agent) followLink(src WorkSource) func(as *Assignment, report []byte, signature string) (*executor.LinkStep, error) {
	return func(as *Assignment, report []byte, signature string) (*executor.LinkStep, error) {
		if !a.measuresLinkInJob() || as.Gang == nil || as.Gang.Nodes < 2 {
			return nil, nil
		}
		if err := conformance.Verify(a.pubPEM, report, signature); err != nil {
			return nil, fmt.Errorf("the rank's run report in the ledger: %w", err)
		}
		rep, err := conformance.Parse(report)
		if err != nil {
			return nil, fmt.Errorf("the rank's run report in the ledger: %w", err)
		}
		if rep.Link == nil || rep.Link.Error != linkPending {
			return nil, nil
		}
		sink, _ := src.(RunReportSink)
		return a.linkStep(as, &SignedReport{Report: rep, Bytes: report, Signature: signature}, sink), nil
	}
}

// amendLink is sr signed again with link and its check in place of the
// pending ones.
func (a *Agent) amendLink(sr *SignedReport, link *conformance.Link, check conformance.Check) (*SignedReport, error) {
	rep := *sr.Report
	rep.Checks = make([]conformance.Check, 0, len(sr.Report.Checks))
	for _, c := range sr.Report.Checks {
		if c.Name == linkCheck {
			c = check
		}
		rep.Checks = append(rep.Checks, c)
	}
	rep.Link = link
	rep.GeneratedAt = time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	b, err := rep.Marshal()
	if err != nil {
		return nil, err
	}
	sig, err := conformance.Sign(a.key, b)
	if err != nil {
		return nil, err
	}
	return &SignedReport{Report: &rep, Bytes: b, Signature: sig, python: sr.python}, nil
}
