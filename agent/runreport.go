package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/retry"
	"github.com/gpupass/gpupass/internal/spec"
)

// A run's own signed report is the audit's proof of the environment the
// run used: the node's periodic report cannot be, since it knows neither
// the run's spec nor its packages. At runtime-init the agent measures the
// node against the run's spec, checks the spec's packages in the run's
// Python, signs the result (bound to the allocation) with its identity key
// and hands it to the broker, which verifies it against the enrolled key
// and keeps it with the run.

// packageCheckPrefix names the per-package checks of a run report
// (package.numpy). They are reported, not enforced, here: runtime-init's
// package check right after fails the run with an event per package.
const packageCheckPrefix = "package."

// RunReportSink is a WorkSource that takes a run's signed report (the
// broker does). Its errors are classified as brokerErr does: one that
// is ErrUnavailable is retried.
type RunReportSink interface {
	SubmitRunReport(ctx context.Context, a *Assignment, report []byte, signature string) error
}

// RunReport measures the node against a run's spec, checks the spec's
// pinned packages in python (the interpreter the run's command uses) and
// signs the report, bound to allocID, with the agent's identity key. pre,
// when it measured python, is a run venv's layout (bundleinstall.go):
// its packages are read from their metadata, since starting that
// interpreter as the agent would run the bundle's code next to the key.
func (a *Agent) RunReport(ctx context.Context, allocID string, sp *spec.Spec, python string, pre *executor.MeasuredPython) (*SignedReport, error) {
	return a.runReport(ctx, allocID, sp, python, pre, nil)
}

// runReport is RunReport with link, a gang rank's measurement of the
// link between the gang's nodes, signed with the rest (nil on one node):
// it is waited for once the rest is measured, so that a measurement
// that waits at the rendezvous for the other ranks overlaps this node's
// own checks.
func (a *Agent) runReport(ctx context.Context, allocID string, sp *spec.Spec, python string, pre *executor.MeasuredPython, link func() *conformance.Link) (*SignedReport, error) {
	node := sp
	if n := sp.Resources.Nodes; n > 1 {
		// A gang's rank: this node holds its share of the GPUs.
		c := *sp
		c.Resources.Count /= n
		node = &c
	}
	exp := suite.FromSpec(node)
	exp.StorageClass = a.o.StorageClass
	res, err := a.suite.Run(ForRun(ctx, node.Resources.Count), exp)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	id := a.agentID
	a.lastFacs = &res.Facts
	a.mu.Unlock()

	var (
		notes    []string
		measured *executor.MeasuredPython
	)
	if pins := suite.PinnedPackages(sp); len(pins) > 0 {
		t0 := time.Now()
		var ps probe.PythonSection
		if pre != nil && pre.Exe == python {
			ps = pre.Section
			ps.Packages = probe.InstalledVersions(ps.SitePaths, exp.PackageNames())
		} else {
			// The node's own interpreter (no bundle): isolated, so the
			// agent's cwd and PYTHON* variables bring no code in.
			sec, err := probe.Python{Exe: python, Packages: exp.PackageNames(), Env: executor.JobEnviron(os.Environ()), Isolated: true}.Measure(ctx)
			if err != nil {
				return nil, fmt.Errorf("checking the run's packages in %s: %w", python, err)
			}
			ps, _ = sec.(probe.PythonSection)
		}
		measured = &executor.MeasuredPython{Exe: python, Section: ps}
		took := float64(time.Since(t0).Microseconds()) / 1000
		res.Facts.Python.Packages = map[string]string{}
		for n := range pins {
			res.Facts.Python.Packages[n] = ps.Packages[n]
		}
		res.Checks = append(res.Checks, packageChecks(pins, ps, took)...)
		notes = append(notes, fmt.Sprintf("packages checked in the run's Python %s (%s)", ps.Executable, orNone(ps.Version)))
	}
	rep, err := res.Report(suite.ReportInput{
		AgentID: id, Node: a.o.node(), StorageClass: a.o.StorageClass, Now: time.Now(), AllocID: allocID, Spec: sp,
	})
	if err != nil {
		return nil, err
	}
	rep.Notes = append(rep.Notes, notes...)
	if link != nil {
		rep.Link = link()
		rep.Checks = append(rep.Checks, linkCheckOf(rep.Link))
	}
	b, err := rep.Marshal()
	if err != nil {
		return nil, err
	}
	sig, err := conformance.Sign(a.key, b)
	if err != nil {
		return nil, err
	}
	a.log.Info("run report signed", "alloc", allocID, "passed", rep.Passed(), "runtime_fingerprint", rep.RuntimeFingerprint,
		"spec_fingerprint", rep.SpecFingerprint, "simulated", rep.Simulated)
	return &SignedReport{Report: rep, Bytes: b, Signature: sig, python: measured}, nil
}

// packageChecks compares each pinned package with what the run's Python
// has (PEP 440 ==: equal versions; a local label in the pin must match).
func packageChecks(pins map[string]string, ps probe.PythonSection, tookMS float64) []conformance.Check {
	names := make([]string, 0, len(pins))
	for n := range pins {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]conformance.Check, 0, len(names))
	for _, n := range names {
		want, got := pins[n], ps.Packages[n]
		c := conformance.Check{Name: packageCheckPrefix + n, Expected: want, Actual: got, Status: conformance.Pass, DurationMS: tookMS}
		switch {
		case !ps.Found:
			c.Actual, c.Status, c.Message = "not found", conformance.Fail, "the run's Python is not usable: "+ps.Reason
		case want == "":
			c.Status, c.Message = conformance.Warn, "not pinned with ==; not checked"
		case got == "":
			c.Actual, c.Status, c.Message = "not installed", conformance.Fail, "not installed in the run's Python"
		default:
			if match, err := spec.PinMatches(want, got); err != nil {
				c.Status, c.Message = conformance.Fail, "cannot compare with the pin: "+err.Error()
			} else if !match {
				c.Status, c.Message = conformance.Fail, "installed version differs from the pin"
			}
		}
		out = append(out, c)
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "version unknown"
	}
	return "Python " + s
}

// runReporter is RunLoop.RunReport for this agent: sign the run's report
// and hand it to the broker through src. It returns the checks that fail
// against the spec, packages left out (runtime-init reports those one by
// one and fails the run right after).
func (a *Agent) runReporter(src WorkSource) func(ctx context.Context, as *Assignment, sp *spec.Spec, python string, pre *executor.MeasuredPython) (string, []conformance.Check, *executor.MeasuredPython, error) {
	return func(ctx context.Context, as *Assignment, sp *spec.Spec, python string, pre *executor.MeasuredPython) (string, []conformance.Check, *executor.MeasuredPython, error) {
		var link func() *conformance.Link
		inJob := false
		if as.Gang != nil && as.Gang.Nodes > 1 {
			if inJob = a.measuresLinkInJob(); inJob {
				// Measured by the rank's own job, on its node:
				// this report is amended with the figure.
				l := pendingLink(as.Gang, sp, as.RequireBandwidth)
				link = func() *conformance.Link { return l }
			} else {
				// Every rank measures at once: each waits at the
				// rendezvous for the others, while the rest of its
				// report is measured. Whatever runReport returns, the
				// measurement has ended by then (a ctx cancelled
				// ends it).
				measured := make(chan *conformance.Link, 1)
				mctx, cancel := context.WithCancel(ctx)
				go func() { measured <- a.measureLink(mctx, as.Gang, sp, as.RequireBandwidth) }()
				link = sync.OnceValue(func() *conformance.Link { return <-measured })
				defer func() { cancel(); link() }()
			}
		}
		sr, err := a.runReport(ctx, as.AllocID, sp, python, pre, link)
		if err != nil {
			return "", nil, nil, err
		}
		sink, _ := src.(RunReportSink)
		if inJob {
			as.linkStep, as.linkReport = a.linkStep(as, sr, sink), sr
		} else if sr.Report.Link != nil {
			c := linkCheckOf(sr.Report.Link)
			as.linkCheck = &c
		}
		measured := sr.python
		var failed []conformance.Check
		for _, c := range sr.Report.Checks {
			if c.Status == conformance.Fail && !strings.HasPrefix(c.Name, packageCheckPrefix) {
				failed = append(failed, c)
			}
		}
		if sink == nil {
			return "node conforms to the spec (suite re-run; no broker to keep the signed run report)", failed, measured, nil
		}
		detail := reportSentDetail(sr.Report)
		if err := submitWithRetry(ctx, sink, as, sr, a.log); err != nil {
			if errors.Is(err, errReportUnsupported) {
				a.log.Warn("the broker does not keep run reports (older broker): this run cannot be audited", "alloc", as.AllocID)
				return "node conforms to the spec (suite re-run; the broker keeps no run reports)", failed, measured, nil
			}
			return "", failed, nil, err
		}
		return detail, failed, measured, nil
	}
}

// reportSentDetail is the run log's line for a run report the broker
// took. Each hash goes under its one name: when the two are equal the
// line says so, rather than print the spec's hash as the runtime's.
func reportSentDetail(rep *conformance.Report) string {
	if rep.RuntimeFingerprint == rep.SpecFingerprint {
		return "signed run report sent to the broker: runtime fingerprint equals the spec fingerprint " + rep.SpecFingerprint
	}
	return fmt.Sprintf("signed run report sent to the broker: runtime fingerprint %s differs from the spec fingerprint %s", rep.RuntimeFingerprint, rep.SpecFingerprint)
}

var errReportUnsupported = errors.New("the broker does not support run reports")

// submitWithRetry hands the report over, retrying while the broker is
// unreachable (a restart must not fail the run) for up to a minute. A
// refusal is final: a report the broker does not accept leaves the run
// without evidence, which must not pass unnoticed.
func submitWithRetry(ctx context.Context, sink RunReportSink, as *Assignment, sr *SignedReport, log *slog.Logger) error {
	deadline := time.Now().Add(time.Minute)
	bo := retry.Backoff(100*time.Millisecond, 5*time.Second)
	for {
		err := sink.SubmitRunReport(ctx, as, sr.Bytes, sr.Signature)
		switch {
		case err == nil, errors.Is(err, errReportUnsupported), errors.Is(err, ErrStaleLease):
			return err
		case !errors.Is(err, ErrUnavailable):
			return err
		case time.Now().After(deadline):
			return err
		}
		wait := bo.NextBackOff()
		log.Warn("sending the run report failed; retrying", "alloc", as.AllocID, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// SubmitRunReport implements RunReportSink over the AgentWorkService.
func (b *brokerSource) SubmitRunReport(ctx context.Context, a *Assignment, report []byte, signature string) error {
	ctx, cancel := context.WithTimeout(ctx, b.call)
	defer cancel()
	_, err := b.c.SubmitRunReport(ctx, connect.NewRequest(&gpupassv1.SubmitRunReportRequest{
		AgentId: b.agentID(), AllocId: a.AllocID, FencingToken: a.FencingToken, Report: report, Signature: signature,
	}))
	if err == nil {
		return nil
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnimplemented:
		return errReportUnsupported
	case connect.CodeFailedPrecondition:
		return fmt.Errorf("%w: %s", ErrStaleLease, api.Describe(err))
	}
	return fmt.Errorf("sending the signed run report of %s: %w", a.AllocID, brokerErr(err))
}

// recheck is runtime-init's conformance step: the run report when the
// agent makes one, else the suite again with the packages left to
// runtime-init.
func (l *RunLoop) recheck(ctx context.Context, a *Assignment, sp *spec.Spec, python string, pre *executor.MeasuredPython) (string, []conformance.Check, *executor.MeasuredPython, error) {
	if l.RunReport != nil {
		return l.RunReport(ctx, a, sp, python, pre)
	}
	cp := *sp
	cp.Runtime.Packages = nil
	failed, err := l.Recheck(ctx, &cp)
	return "node conforms to the spec (suite re-run)", failed, nil, err
}
