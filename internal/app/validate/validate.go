// Package validate is the validate use case: find the spec, read it under
// the spec size limit and lint it, returning the typed result. Rendering
// (text, JSON, SARIF, annotations) and the flags or CI inputs that chose
// the spec are the caller's (the gpupass command, also as a CI step); this
// package imports no cobra and prints nothing.
package validate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/spec"
)

// SpecFileNames are the spec files looked up in the working directory, in
// order: gpupass.yaml wins when both are present.
var SpecFileNames = []string{"gpupass.yaml", "lightning-cloud.yaml"}

// Options say which spec to validate.
type Options struct {
	// Spec is the spec file; empty: look up SpecFileNames in Dir.
	Spec string
	// Dir is where the spec is looked up and a relative Spec is read from.
	Dir string
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
}

// Result is a validated spec.
type Result struct {
	*spec.Result
	// Source is the spec's bytes as read (a broker dry run sends them).
	Source []byte
}

// NoSpecError is a directory without any of SpecFileNames and no spec
// named; the caller says how its user names one (Above, when a
// directory above holds one).
type NoSpecError struct {
	Dir string
	// Above is SpecAbove(Dir).
	Above string
}

func (e *NoSpecError) Error() string {
	if e.Above != "" {
		return fmt.Sprintf("no %s in %s; the project's spec is %s", strings.Join(SpecFileNames, " or "), e.Dir, e.Above)
	}
	return fmt.Sprintf("no %s in %s: run `gpupass init` for a starter spec", strings.Join(SpecFileNames, " or "), e.Dir)
}

// SpecAbove is the nearest of SpecFileNames in a directory above dir,
// relative to dir ("../gpupass.yaml"), or "". From a subdirectory of a
// project its spec is the fix, not `gpupass init` writing a second
// project there. The search stops after a git work tree's root and at
// home, as the search for the project's .gpupass does.
func SpecAbove(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	home, _ := os.UserHomeDir()
	var spec string
	fsutil.FindUp(abs, home, func(d string) bool {
		if d == abs {
			return false // dir itself is where the caller looked
		}
		for _, n := range SpecFileNames {
			if fi, err := os.Stat(filepath.Join(d, n)); err == nil && fi.Mode().IsRegular() {
				spec = filepath.Join(d, n)
				return true
			}
		}
		return false
	})
	if spec == "" {
		return ""
	}
	rel, err := filepath.Rel(abs, spec)
	if err != nil {
		return ""
	}
	return rel
}

// Run finds, reads and lints the spec. A spec with errors is a Result
// with Valid false, not an error: errors are for a spec that cannot be
// found or read.
func Run(_ context.Context, o Options) (*Result, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	path, err := find(o, log)
	if err != nil {
		return nil, err
	}
	b, err := read(o.Dir, path)
	if err != nil {
		return nil, err
	}
	res := spec.Validate(path, b)
	log.Debug("validated spec", "file", path, "errors", res.Errors, "warnings", res.Warnings, "fingerprint", res.Fingerprint)
	return &Result{Result: res, Source: b}, nil
}

// find returns the spec path: o.Spec, or the first SpecFileNames entry
// present in o.Dir.
func find(o Options, log *slog.Logger) (string, error) {
	if o.Spec != "" {
		return o.Spec, nil
	}
	var found []string
	for _, n := range SpecFileNames {
		if _, err := os.Stat(filepath.Join(o.Dir, n)); err == nil {
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		return "", &NoSpecError{Dir: o.Dir, Above: SpecAbove(o.Dir)}
	case 2:
		log.Warn("both spec files present; using the first", "using", found[0], "ignored", found[1])
	}
	return found[0], nil
}

// read reads at most spec.MaxSize+1 bytes: enough for the parser to tell
// a file is too large without holding all of it.
func read(dir, path string) ([]byte, error) {
	full := path
	if !filepath.IsAbs(full) && dir != "" {
		full = filepath.Join(dir, path)
	}
	f, err := os.Open(full)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("reading spec %s: file does not exist", path)
		}
		return nil, fmt.Errorf("reading spec %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading spec %s: %w", path, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("reading spec %s: it is a directory; pass the spec file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, spec.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading spec %s: %w", path, err)
	}
	return b, nil
}
