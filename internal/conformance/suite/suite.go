// Package suite runs the conformance checks over the probes and turns
// the result into a conformance.Report. It is separate from package
// conformance so that the report contract stays stdlib-only for the
// broker and audit, while this runner may import the probes and the spec.
//
// Caching: a probe that implements probe.Keyed is measured again only
// when its state key changes (nvcc: the binary's path, size and mtime;
// Python: the interpreter and the mtimes of its sys.path directories,
// which change when a package is installed or removed; read throughput:
// the same mount and a measurement younger than an hour). GPUs, free
// space, mount options and FIPS are cheap and live, so they are always
// measured. Checks built only from reused sections say cached: true.
package suite

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/probe"
)

// Suite runs probes and checks. It is safe for concurrent use; runs are
// serialised so that a timer run and an on-demand run never probe twice
// at once.
type Suite struct {
	probes []probe.Probe
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	key     string
	section probe.Section
}

// New returns a suite over probes (at most one per name; a later one
// replaces an earlier one, so a simulated probe can override a real one).
func New(probes ...probe.Probe) *Suite {
	byName := map[string]int{}
	var ps []probe.Probe
	for _, p := range probes {
		if p == nil {
			continue
		}
		if i, ok := byName[p.Name()]; ok {
			ps[i] = p
			continue
		}
		byName[p.Name()] = len(ps)
		ps = append(ps, p)
	}
	return &Suite{probes: ps, now: time.Now, cache: map[string]cached{}}
}

// Result is one run of the suite.
type Result struct {
	Facts  probe.Facts
	Checks []conformance.Check
	// Wall is the wall time of the whole run (probes run in parallel).
	Wall time.Duration
	// Reused names the probes whose previous section was reused.
	Reused []string
	// ProbeTime is the measuring time of each probe in this run (zero
	// for reused ones).
	ProbeTime map[string]time.Duration
}

// Passed reports whether no check failed.
func (r *Result) Passed() bool {
	for _, c := range r.Checks {
		if c.Status == conformance.Fail {
			return false
		}
	}
	return true
}

// Run measures (or reuses) every probe and evaluates the checks against exp.
func (s *Suite) Run(ctx context.Context, exp Expectations) (*Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := s.now()
	type outcome struct {
		name    string
		section probe.Section
		key     string
		keyed   bool
		reused  bool
		took    time.Duration
		err     error
	}
	outs := make([]outcome, len(s.probes))
	var wg sync.WaitGroup
	for i, p := range s.probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := outcome{name: p.Name()}
			prev, have := s.cache[p.Name()]
			if k, ok := p.(probe.Keyed); ok && have {
				if key, ok := k.StateKey(ctx, prev.section); ok {
					o.key, o.keyed = key, true
					if key == prev.key {
						o.section, o.reused = prev.section, true
						outs[i] = o
						return
					}
				}
			}
			t0 := time.Now()
			o.section, o.err = p.Measure(ctx)
			o.took = time.Since(t0)
			if k, ok := p.(probe.Keyed); ok && o.err == nil {
				// The key is taken after measuring so it describes the
				// state the section was measured in.
				o.key, o.keyed = k.StateKey(ctx, o.section)
			}
			outs[i] = o
		}()
	}
	wg.Wait()
	res := &Result{ProbeTime: map[string]time.Duration{}}
	reused := map[string]bool{}
	for _, o := range outs {
		if o.err != nil {
			return nil, fmt.Errorf("running probe %s: %w", o.name, o.err)
		}
		res.Facts.Apply(o.section)
		res.ProbeTime[o.name] = o.took
		if o.reused {
			reused[o.name] = true
			res.Reused = append(res.Reused, o.name)
		}
		if o.keyed {
			s.cache[o.name] = cached{key: o.key, section: o.section}
		} else {
			delete(s.cache, o.name)
		}
	}
	res.Checks = evaluate(&res.Facts, exp, res.ProbeTime, reused)
	res.Wall = s.now().Sub(start)
	return res, nil
}

// Invalidate drops every cached section, so the next run measures all.
func (s *Suite) Invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache = map[string]cached{}
}
