package agent

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/rendezvous"
	"github.com/gpupass/gpupass/internal/spec"
)

// At gang start every rank measures the link the spec declared
// (resources.network.bandwidth_gbps) before the job runs: an all-reduce
// of a fixed size across the gang with torch.distributed (gloo over TCP
// without a GPU, NCCL with), at the gang's rendezvous. Each rank signs
// the figure in its run report. Below the declared figure is a recorded
// shortfall (a warning check, as a storage class below its floor is),
// and a failed check when the run was submitted with --require-bandwidth.

//go:embed allreduce.py
var allreduceScript string

// Link measurement parameters: 32 MiB a rank, the median of 5 timed
// all-reduces after one warm-up, each rank waiting at most linkTimeout
// for the others to join.
const (
	linkBytes      = 32 << 20
	linkIterations = 5
	linkTimeout    = 90 * time.Second
	// linkCheck is the run report's check of the link.
	linkCheck = "network.allreduce_gbps"
	// BusBWFormula is how the measured figure is derived.
	BusBWFormula = "busbw = algbw × 2(n−1)/n (nccl-tests), algbw = bytes / median seconds of the slowest rank"
)

// defaultLinkPython runs the measurement where the agent has no
// --python: Debian's python3-torch lives there.
const defaultLinkPython = "/usr/bin/python3"

// measureLink runs the all-reduce as rank g.NodeRank of the gang. It is
// the node's own interpreter, isolated (-I: no cwd, no PYTHON*
// variables, no user site), running gpupass's script: nothing the job or
// its bundle brought. The figure is always recorded, never clamped; what
// kept it from being measured is recorded as Error.
func (a *Agent) measureLink(ctx context.Context, g *rendezvous.Gang, sp *spec.Spec, required bool) *conformance.Link {
	l := &conformance.Link{Ranks: g.Nodes, Bytes: linkBytes, Iterations: linkIterations, Formula: BusBWFormula,
		DeclaredGbps: sp.Resources.Network.BandwidthGbps, Required: required, MasterAddr: g.MasterAddr}
	defer func() { l.Shortfall = l.DeclaredGbps > 0 && (l.Error != "" || l.BusBWGbps < l.DeclaredGbps) }()
	if a.o.standsFor != nil {
		// A cluster node whose runner takes no link step (Slurm's and
		// Kubernetes' do: measuresLinkInJob): its rank runs in the
		// cluster's job, on the node, while this agent runs elsewhere
		// (a login node, a pod of its own). An all-reduce from here would
		// measure this host's network, not the gang's link, or wait
		// out its timeout for peers it cannot reach: recorded as not
		// measured, a shortfall where a figure was declared.
		l.Error = "not measured: this node's rank runs as its cluster's job, away from the agent that stands for the node, and the all-reduce is measured only where the agent runs the job itself (the local executor) or the cluster's job takes the measurement as a step (Slurm, Kubernetes)"
		return l
	}
	l.MeasuredBy = conformance.LinkByAgent
	if err := g.Validate(); err != nil {
		l.Error = "the rendezvous: " + err.Error()
		return l
	}
	py := a.o.Python
	if py == "" {
		py = defaultLinkPython
	}
	// One measurement process a node: its rank is the node's rank, the
	// world the gang's nodes, whatever processes each node's job starts.
	req := linkRequest{MasterAddr: g.MasterAddr, MasterPort: g.MasterPort, Rank: g.NodeRank, WorldSize: g.Nodes,
		Bytes: linkBytes, Iterations: linkIterations, TimeoutSeconds: int(linkTimeout / time.Second)}
	ctx, cancel := context.WithTimeout(ctx, linkTimeout+30*time.Second)
	defer cancel()
	t0 := time.Now()
	var w *linkWorker
	if a.link != nil {
		var why string
		if w, why = a.link.take(); w == nil {
			a.log.Info("link measurement starts cold", "why", why)
		}
	}
	l.Warm = w != nil
	out, err := "", errWorkerGone
	if w != nil {
		out, err = w.measure(ctx, req)
		if errors.Is(err, errWorkerGone) {
			// Dead before it read the rendezvous: nothing of the
			// gang's was started, so a cold one takes its place.
			a.log.Warn("the warm link measurement process was gone; starting one now", "err", err)
			l.Warm = false
		}
	}
	if errors.Is(err, errWorkerGone) {
		if w, err = startLinkWorker(py); err == nil {
			out, err = w.measure(ctx, req)
		}
	}
	if err != nil {
		l.Error = fmt.Sprintf("%s: %v", py, err)
		a.log.Warn("link measurement failed", "err", l.Error, "warm", l.Warm)
		return l
	}
	if err := readLinkResult(l, out); err != nil {
		l.Error = err.Error()
		return l
	}
	a.log.Info("link measured", "busbw_gbps", l.BusBWGbps, "declared_gbps", l.DeclaredGbps, "backend", l.Backend,
		"ranks", l.Ranks, "master_addr", l.MasterAddr, "warm", l.Warm, "took", time.Since(t0).Round(time.Millisecond))
	return l
}

// readLinkResult reads the measurement's output (allreduce.py's last
// line) into l: its figures, for l.Ranks ranks.
func readLinkResult(l *conformance.Link, out string) error {
	var got struct {
		Backend   string  `json:"backend"`
		Ranks     int     `json:"ranks"`
		Seconds   float64 `json:"seconds"`
		AlgBWGbps float64 `json:"algbw_gbps"`
		BusBWGbps float64 `json:"busbw_gbps"`
		// MasterAddr is where the ranks met: a cluster's step reads
		// it from the rank's variables, which the agent may not know
		// (a Kubernetes rank 0's pod IP).
		MasterAddr string `json:"master_addr"`
		Torch      string `json:"torch"`
		InCommand  bool   `json:"in_command"`
	}
	if err := json.Unmarshal([]byte(lastLine(out)), &got); err != nil || got.Ranks != l.Ranks || got.Seconds <= 0 {
		return fmt.Errorf("the measurement printed %.200q, not its result", lastLine(out))
	}
	if got.MasterAddr != "" {
		if err := rendezvous.CheckAddr(got.MasterAddr); err != nil {
			return fmt.Errorf("the measurement's master_addr: %w", err)
		}
		l.MasterAddr = got.MasterAddr
	}
	if len(got.Torch) > 64 || strings.ContainsFunc(got.Torch, func(r rune) bool { return r < ' ' || r > '~' }) {
		return fmt.Errorf("the measurement's torch version %.70q is not one", got.Torch)
	}
	l.Backend, l.Seconds, l.AlgBWGbps, l.BusBWGbps = got.Backend, got.Seconds, round3(got.AlgBWGbps), round3(got.BusBWGbps)
	l.Torch, l.InCommand = got.Torch, got.InCommand
	return nil
}

// measuredBy says, for a check's figure, what measured it when that was
// not the agent's own process: the rank's job, and in it the command's
// own Python or a step before the command.
func measuredBy(l *conformance.Link) string {
	switch {
	case l.MeasuredBy != conformance.LinkByJob:
		return ""
	case l.InCommand:
		return ", measured by the command's own Python once it imported torch " + l.Torch + ": the figure the rank's job wrote"
	default:
		return ", measured by a step of the rank's job before its command: the figure the job wrote"
	}
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// linkEvent is the run log's line for the link check of a report this
// node's agent signed: what was measured, what the spec declares and, for
// a shortfall, that it was recorded (a WARN) or fails the run (an ERROR,
// --require-bandwidth).
func linkEvent(c conformance.Check) (level events.Level, component, msg string, fields map[string]string) {
	level, msg = events.Info, "link measured by this node's agent: "+c.Actual
	switch {
	case c.Status == conformance.Skip:
		msg = "link not measured by this node's agent: " + c.Message
	case c.Actual == "not measured":
		msg = "link not measured by this node's agent"
	}
	if c.Expected != "" {
		msg += "; declared " + c.Expected
	}
	switch c.Status {
	case conformance.Warn:
		level, msg = events.Warn, msg+": "+c.Message
	case conformance.Fail:
		level, msg = events.Error, msg+": "+c.Message
	}
	return level, events.RuntimeInit, msg, map[string]string{"check": c.Name, "status": string(c.Status)}
}

// linkCheckOf is the run report's check of the link: a pass, a recorded
// shortfall (warn), or with --require-bandwidth a failure, each saying
// both figures.
func linkCheckOf(l *conformance.Link) conformance.Check {
	c := conformance.Check{Name: linkCheck, Status: conformance.Pass,
		Actual: fmt.Sprintf("%g Gbit/s bus bandwidth (all-reduce of %d MiB over %s across %d ranks, rank 0 at %s%s)", l.BusBWGbps, l.Bytes>>20, l.Backend, l.Ranks, l.MasterAddr, measuredBy(l))}
	if l.Error != "" {
		c.Actual, c.Status, c.Message = "not measured", conformance.Skip, l.Error
	}
	if l.DeclaredGbps > 0 {
		c.Expected = fmt.Sprintf(">= %g Gbit/s (resources.network.bandwidth_gbps)", l.DeclaredGbps)
	}
	if !l.Shortfall {
		return c
	}
	what := fmt.Sprintf("measured %g Gbit/s, below the declared %g Gbit/s", l.BusBWGbps, l.DeclaredGbps)
	if l.Error != "" {
		what = fmt.Sprintf("not measured (%s), the spec declares %g Gbit/s", l.Error, l.DeclaredGbps)
	}
	if l.Required {
		c.Status, c.Message = conformance.Fail, what+" (--require-bandwidth)"
		return c
	}
	c.Status, c.Message = conformance.Warn, what+": recorded as a shortfall (--require-bandwidth fails the run instead)"
	return c
}
