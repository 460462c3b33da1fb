package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/exitcode"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// PushOptions say what to push where.
type PushOptions struct {
	Ref        string
	Wheelhouse string
	Registry   bundle.RegistryOptions
	Target     Target
	// MountFrom is a repository on the same registry to mount existing
	// blobs from (REGISTRY/REPO).
	MountFrom string
	// Source is the org.opencontainers.image.source annotation (default:
	// from the CI's variables through Getenv).
	Source string
	// NoCache re-reads every wheel instead of trusting the scan cache.
	NoCache bool
	// Progress, when set, receives progress (a bar when TTY).
	Progress io.Writer
	TTY      bool
	Getenv   func(string) string
	Logger   *slog.Logger
}

// PushResult is what was pushed and how the wheelhouse covered the spec.
type PushResult struct {
	bundle.PushResult
	Coverage *bundle.Coverage `json:"coverage,omitempty"`
	// Uncovered lists the coverage gaps AllowIncomplete let pass.
	Uncovered []string `json:"uncovered,omitempty"`
}

// IncompleteError is a wheelhouse that does not cover the spec; nothing
// was pushed.
type IncompleteError struct {
	Wheelhouse, Spec string
	Problems         []string
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("wheelhouse %s does not cover spec %s:\n  - %s\nnothing was pushed", e.Wheelhouse, e.Spec, strings.Join(e.Problems, "\n  - "))
}

// Push checks coverage and pushes. Wheelhouse problems and incomplete
// coverage are findings (exit code 1); an incomplete coverage wraps an
// *IncompleteError.
func Push(ctx context.Context, o PushOptions) (*PushResult, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Wheelhouse == "" {
		return nil, &fielderr.Error{Field: "Wheelhouse", Problem: "is required: " + "the directory of .whl files to push"}
	}
	s, err := o.Target.load()
	if err != nil {
		return nil, err
	}
	// Names are enough for the coverage check; Push checks each wheel's
	// zip and RECORD as it uploads, so checking overlaps the upload.
	wheels, err := bundle.List(o.Wheelhouse)
	if err != nil {
		var we *bundle.WheelhouseError
		if errors.As(err, &we) {
			return nil, findings(err)
		}
		return nil, err
	}
	res := &PushResult{}
	python := o.Target.Python
	if s != nil {
		t, cov, err := o.Target.coverage(s, wheels)
		if err != nil {
			return nil, err
		}
		python, res.Coverage = t.Python, cov
		if !cov.Complete() {
			ie := &IncompleteError{Wheelhouse: o.Wheelhouse, Spec: o.Target.Spec, Problems: cov.Problems()}
			if !o.Target.AllowIncomplete {
				return nil, findings(ie)
			}
			res.Uncovered = ie.Problems
			log.Warn(fmt.Sprintf("wheelhouse %s does not cover spec %s:\n  - %s", o.Wheelhouse, o.Target.Spec, strings.Join(ie.Problems, "\n  - ")))
		}
	}
	var prog *bundle.TextProgress
	popts := bundle.PushOptions{
		Registry: o.Registry, Python: python, Source: o.source(), MountFrom: o.MountFrom, Logger: log,
	}
	if o.Progress != nil {
		prog = bundle.NewTextProgress(o.Progress, o.TTY, "pushed")
		popts.Progress = prog
	}
	if !o.NoCache {
		popts.ScanCache = bundle.DefaultScanCache()
	}
	if s != nil {
		popts.Fingerprint = s.fingerprint
	}
	pushed, err := bundle.Push(ctx, o.Ref, wheels, popts)
	if prog != nil {
		prog.Finish()
	}
	var we *bundle.WheelhouseError
	if errors.As(err, &we) {
		return nil, findings(fmt.Errorf("%w\nnothing was tagged", err))
	}
	if err != nil {
		return nil, err
	}
	res.PushResult = pushed
	return res, nil
}

func (o PushOptions) source() string {
	if o.Source != "" || o.Getenv == nil {
		return o.Source
	}
	if s, r := o.Getenv("GITHUB_SERVER_URL"), o.Getenv("GITHUB_REPOSITORY"); s != "" && r != "" {
		return s + "/" + r
	}
	return o.Getenv("CI_PROJECT_URL")
}

// RenderPush prints the pushed reference, or with json everything.
func RenderPush(w io.Writer, r *PushResult, json bool) error {
	if json {
		return writeJSON(w, r)
	}
	_, err := fmt.Fprintln(w, r.Reference)
	return err
}

func findings(err error) error { return &exitcode.Error{Code: exitcode.Findings, Err: err} }
