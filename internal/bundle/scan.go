package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/gpupass/gpupass/internal/wheel"
)

// Scan reads a wheelhouse: every entry of dir must be a regular .whl file
// with a valid PEP 427 name, a readable zip whose RECORD matches its
// contents, and no two wheels may be the same distribution, version and
// tags. It hashes each wheel (streaming) with up to jobs in parallel and
// returns the wheels sorted by file name, or every problem at once.
func Scan(ctx context.Context, dir string, jobs int) ([]Wheel, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading wheelhouse: %w", err)
	}
	var problems []error
	var wheels []Wheel
	var names []wheel.Filename
	seen := map[string]string{}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() {
			problems = append(problems, fmt.Errorf("%s: not a regular file (directories and links are refused; a wheelhouse holds only .whl files)", filepath.Join(dir, name)))
			continue
		}
		if name == LockFile {
			// A pulled wheelhouse carries its lock; pushing it again
			// writes a fresh one.
			continue
		}
		f, err := wheel.ParseFilename(name)
		if err != nil {
			problems = append(problems, fmt.Errorf("%s: %w (move it out of the wheelhouse)", filepath.Join(dir, name), err))
			continue
		}
		key := f.Name() + " " + strings.ToLower(f.Version) + " " + strings.Join(tagStrings(f.Tags), ".")
		if other, dup := seen[key]; dup {
			problems = append(problems, fmt.Errorf("%s: duplicate of %s (same distribution, version and tags; keep one)", name, other))
			continue
		}
		seen[key] = name
		names = append(names, f)
		wheels = append(wheels, Wheel{
			File: name, Name: f.Name(), Version: f.Version, Tags: tagStrings(f.Tags),
			path: filepath.Join(dir, name),
		})
	}
	if len(entries) == 0 {
		problems = append(problems, fmt.Errorf("wheelhouse %s is empty", dir))
	}
	errs := make([]error, len(wheels))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(jobs, 1))
	for i := range wheels {
		g.Go(func() error {
			if gctx.Err() != nil {
				return gctx.Err()
			}
			errs[i] = checkWheelFile(&wheels[i], names[i])
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	problems = append(problems, nonNil(errs)...)
	if len(problems) > 0 {
		return nil, &WheelhouseError{Dir: dir, Problems: problems}
	}
	sort.Slice(wheels, func(i, j int) bool { return wheels[i].File < wheels[j].File })
	return wheels, nil
}

// checkWheelFile hashes the file and checks its zip and RECORD through
// one open file.
func checkWheelFile(w *Wheel, f wheel.Filename) error {
	fh, err := os.Open(w.path)
	if err != nil {
		return err
	}
	defer fh.Close()
	h := sha256.New()
	n, err := io.Copy(h, fh)
	if err != nil {
		return fmt.Errorf("wheel %s: %w", w.File, err)
	}
	w.SHA256, w.Size = hex.EncodeToString(h.Sum(nil)), n
	return wheel.VerifyReader(fh, n, f)
}

// WheelhouseError lists every problem found in a wheelhouse.
type WheelhouseError struct {
	Dir      string
	Problems []error
}

func (e *WheelhouseError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "wheelhouse %s: %d problem(s):", e.Dir, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  - ")
		b.WriteString(p.Error())
	}
	return b.String()
}

func (e *WheelhouseError) Unwrap() []error { return e.Problems }

func nonNil(errs []error) []error {
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}
