// Package bundle holds the bundle use cases: push a wheelhouse after
// checking that it covers a spec, pull a bundle into a verified
// wheelhouse, and verify a wheelhouse on disk. Each takes typed options
// and returns a typed result with a Render beside it; the gpupass command
// calls them (as a CI step with -o github|gitlab too). It imports no
// cobra and names no flag: bad options are *fielderr.Error naming the
// Options field.
package bundle

import (
	"fmt"
	"os"
	"strings"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/wheel"
)

// The nodes' platform when nothing names one.
const (
	DefaultArch  = "x86_64"
	DefaultGLIBC = "2.35"
)

// Target says which interpreter and platform the wheels must fit.
type Target struct {
	// Spec is the spec file whose pinned packages the wheelhouse must
	// cover; empty skips the coverage check.
	Spec string
	// Python is the target CPython version (default: the spec's
	// runtime.python).
	Python string
	Arch   string // default DefaultArch
	GLIBC  string // default DefaultGLIBC
	// AllowIncomplete lets coverage gaps pass (push pushes anyway,
	// verify lists them as Uncovered).
	AllowIncomplete bool
}

// loadedSpec is what the bundle use cases need from a spec.
type loadedSpec struct {
	pins        []bundle.Pin
	python      string
	fingerprint string
}

// load reads the spec. The spec need not be valid as a whole (it may not
// name its bundle yet — that is what is being pushed); its packages must
// be pinned and its python set.
func (t Target) load() (*loadedSpec, error) {
	if t.Spec == "" {
		return nil, nil
	}
	b, err := os.ReadFile(t.Spec)
	if err != nil {
		return nil, fmt.Errorf("reading spec: %w", err)
	}
	res := spec.Validate(t.Spec, b)
	if res.Spec == nil {
		var msgs []string
		for _, f := range res.Findings {
			msgs = append(msgs, fmt.Sprintf("%s:%d:%d: %s", f.File, f.Line, f.Column, f.Message))
		}
		return nil, fmt.Errorf("spec %s cannot be read: %s", t.Spec, strings.Join(msgs, "; "))
	}
	pins, err := bundle.ParsePins(res.Spec.Runtime.Packages)
	if err != nil {
		return nil, fmt.Errorf("spec %s: %w", t.Spec, err)
	}
	fp := res.Fingerprint
	if fp == "" {
		fp, _ = spec.Fingerprint(res.Spec)
	}
	return &loadedSpec{pins: pins, python: res.Spec.Runtime.Python, fingerprint: fp}, nil
}

func (t Target) wheelTarget(s *loadedSpec) (wheel.Target, error) {
	py := t.Python
	if py == "" && s != nil {
		py = s.python
	}
	if py == "" {
		return wheel.Target{}, &fielderr.Error{Field: "Python", Err: fmt.Errorf("spec %s: runtime.python is empty; set it in the spec or name the python version", t.Spec)}
	}
	arch, glibc := t.Arch, t.GLIBC
	if arch == "" {
		arch = DefaultArch
	}
	if glibc == "" {
		glibc = DefaultGLIBC
	}
	wt := wheel.Target{Python: py, OS: "linux", Arch: arch, GLIBC: glibc}
	if _, err := wheel.SupportedTags(wt); err != nil {
		return wheel.Target{}, err
	}
	return wt, nil
}

// coverage checks wheels against the spec's pins.
func (t Target) coverage(s *loadedSpec, wheels []bundle.Wheel) (wheel.Target, *bundle.Coverage, error) {
	wt, err := t.wheelTarget(s)
	if err != nil {
		return wt, nil, err
	}
	c, err := bundle.CheckCoverage(s.pins, wt, wheels)
	if err != nil {
		return wt, nil, err
	}
	return wt, &c, nil
}
