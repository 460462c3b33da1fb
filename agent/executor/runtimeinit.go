package executor

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
)

// runtimeInit checks the spec's declared packages in the run's Python
// before the command starts: from the measurement a runtime-init check
// made (a bundle's venv is read from its *.dist-info metadata, never
// started as the agent), else by internal/probe's isolated Python probe
// of the node's own interpreter. It returns "" when the run may start, else why not;
// each mismatch is an ERROR event naming package, expected and installed
// version.
func runtimeInit(ctx context.Context, job Job, rec *recorder) string {
	s := job.Spec
	if s == nil || len(s.Runtime.Packages) == 0 {
		rec.event(events.Info, events.RuntimeInit, "no declared packages to check", nil)
		return ""
	}
	type want struct {
		name, norm string
		as         string
	}
	var wants []want
	for _, p := range s.Runtime.Packages {
		req, err := spec.ParseRequirement(p)
		if err != nil {
			msg := fmt.Sprintf("spec runtime.packages entry %q: %v", p, err)
			rec.event(events.Error, events.RuntimeInit, msg, nil)
			return msg
		}
		_, ok := req.Pinned()
		if !ok {
			rec.event(events.Warn, events.RuntimeInit, fmt.Sprintf("package %s is not pinned with ==; not checked", req.Name), map[string]string{"package": req.Name})
			continue
		}
		wants = append(wants, want{name: req.Name, norm: probe.NormalizePackage(req.Name), as: req.Specs[0].Version})
	}
	if len(wants) == 0 {
		return ""
	}
	names := make([]string, len(wants))
	for i, w := range wants {
		names[i] = w.norm
	}
	var ps probe.PythonSection
	if m := job.Measured; m != nil && m.Exe == job.Python {
		ps = m.Section
	} else {
		// No runtime-init check measured it, so it is the node's own
		// interpreter (a bundle's venv is always measured, from its
		// metadata): started isolated, never over the job's files.
		sec, err := probe.Python{Exe: job.Python, Packages: names, Env: job.Environ(), Isolated: true}.Measure(ctx)
		if err != nil {
			return "cancelled while checking packages"
		}
		ps, _ = sec.(probe.PythonSection)
	}
	if !ps.Found {
		msg := fmt.Sprintf("the run's Python is not usable: %s", ps.Reason)
		rec.event(events.Error, events.RuntimeInit, msg, nil)
		return msg
	}
	rec.event(events.Info, events.RuntimeInit, fmt.Sprintf("python %s at %s", ps.Version, ps.Executable), map[string]string{"python": ps.Version})
	var bad []string
	sort.Slice(wants, func(i, j int) bool { return wants[i].norm < wants[j].norm })
	for _, w := range wants {
		got := ps.Packages[w.norm]
		fields := map[string]string{"package": w.name, "expected": w.as, "installed": got}
		if got == "" {
			fields["installed"] = "none"
			rec.event(events.Error, events.RuntimeInit, fmt.Sprintf("package %s: expected %s, not installed", w.name, w.as), fields)
			bad = append(bad, fmt.Sprintf("%s expected %s, not installed", w.name, w.as))
			continue
		}
		if match, err := spec.PinMatches(w.as, got); err != nil || !match {
			why := fmt.Sprintf("expected %s, installed %s", w.as, got)
			if err != nil {
				why += " (" + err.Error() + ")"
			}
			rec.event(events.Error, events.RuntimeInit, fmt.Sprintf("package %s: %s", w.name, why), fields)
			bad = append(bad, fmt.Sprintf("%s %s", w.name, why))
			continue
		}
		rec.event(events.Info, events.RuntimeInit, fmt.Sprintf("package %s %s (expected %s)", w.name, got, w.as), fields)
	}
	if len(bad) > 0 {
		return "package mismatch: " + strings.Join(bad, "; ")
	}
	return ""
}
