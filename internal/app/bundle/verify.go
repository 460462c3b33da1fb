package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/gpupass/gpupass/internal/bundle"
)

// VerifyOptions say which wheelhouse to check and against what.
type VerifyOptions struct {
	Dir    string
	Target Target
	// Jobs is how many wheels are checked in parallel.
	Jobs int
}

// VerifyResult is what verify found.
type VerifyResult struct {
	Dir      string           `json:"dir"`
	OK       bool             `json:"ok"`
	Locked   bool             `json:"locked"`
	Wheels   []bundle.Wheel   `json:"wheels"`
	Problems []string         `json:"problems"`
	Coverage *bundle.Coverage `json:"coverage,omitempty"`
	// Uncovered lists the coverage gaps Target.AllowIncomplete let pass.
	Uncovered []string `json:"uncovered,omitempty"`
}

// Verify checks every wheel of Dir (name, zip, RECORD hashes, duplicates,
// the lock of a pulled wheelhouse) and, with a spec, its coverage.
// Problems found are in the result (see Err); the error is for what kept
// the check from running.
func Verify(ctx context.Context, o VerifyOptions) (*VerifyResult, error) {
	s, err := o.Target.load()
	if err != nil {
		return nil, err
	}
	res := &VerifyResult{Dir: o.Dir, Wheels: []bundle.Wheel{}, Problems: []string{}}
	wheels, err := bundle.Scan(ctx, o.Dir, bundle.ScanOptions{Jobs: o.Jobs})
	var we *bundle.WheelhouseError
	switch {
	case errors.As(err, &we):
		for _, p := range we.Problems {
			res.Problems = append(res.Problems, p.Error())
		}
	case err != nil:
		return nil, err
	default:
		res.Wheels = wheels
		// A pulled wheelhouse carries its lock: hold it to it.
		locked, err := bundle.CheckLock(o.Dir, wheels)
		res.Locked = locked
		if err != nil {
			res.Problems = append(res.Problems, err.Error())
		}
	}
	if s != nil && err == nil {
		_, c, err := o.Target.coverage(s, wheels)
		if err != nil {
			return nil, err
		}
		res.Coverage = c
		if o.Target.AllowIncomplete {
			res.Uncovered = c.Problems()
		} else {
			res.Problems = append(res.Problems, c.Problems()...)
		}
	}
	res.OK = len(res.Problems) == 0
	return res, nil
}

// Err is nil when the wheelhouse is ok, else a findings error (exit code
// 1) whose message the rendering already printed.
func (r *VerifyResult) Err() error {
	if r.OK {
		return nil
	}
	return findings(nil)
}

// RenderVerify prints the result; allowed names the option that lets
// coverage gaps pass, as the user gives it (e.g. "--allow-incomplete").
func RenderVerify(w io.Writer, r *VerifyResult, json bool, allowed string) error {
	if json {
		return writeJSON(w, r)
	}
	if !r.OK {
		if _, err := fmt.Fprintf(w, "%s: %d problem(s):\n", r.Dir, len(r.Problems)); err != nil {
			return err
		}
		for _, p := range r.Problems {
			if _, err := fmt.Fprintf(w, "  - %s\n", p); err != nil {
				return err
			}
		}
		return nil
	}
	msg := fmt.Sprintf("%s: %d wheels ok", r.Dir, len(r.Wheels))
	if r.Locked {
		msg += ", matching " + bundle.LockFile
	}
	if r.Coverage != nil && len(r.Uncovered) == 0 {
		msg += fmt.Sprintf(", all %d pinned packages covered for python %s / %s", len(r.Coverage.Covered), r.Coverage.Python, r.Coverage.Platform)
	}
	if _, err := fmt.Fprintln(w, msg); err != nil {
		return err
	}
	for _, u := range r.Uncovered {
		if _, err := fmt.Fprintf(w, "  - not covered (%s): %s\n", allowed, u); err != nil {
			return err
		}
	}
	return nil
}
