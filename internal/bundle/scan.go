package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpupass/gpupass/internal/wheel"
)

// wheelsRead counts wheels Scan actually read (tests of the cache).
var wheelsRead atomic.Int64

// ScanOptions configure Scan.
type ScanOptions struct {
	// Jobs is how many wheels are checked at once.
	Jobs int
	// Cache is the scan cache file (DefaultScanCache); empty: no cache.
	Cache string
}

// List reads a wheelhouse's directory without reading the wheels: every
// entry of dir must be a regular .whl file with a valid PEP 427 name, and
// no two wheels may be the same distribution, version and tags. The
// wheels it returns have no digest yet (Scan, or Push, checks them).
func List(dir string) ([]Wheel, error) {
	wheels, problems, err := listDir(dir)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, &WheelhouseError{Dir: dir, Problems: problems}
	}
	return wheels, nil
}

// listDir returns the good wheels of dir and the problems with the rest.
func listDir(dir string) ([]Wheel, []error, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("reading wheelhouse: %w", err)
	}
	var problems []error
	var wheels []Wheel
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
		wheels = append(wheels, Wheel{
			File: name, Name: f.Name(), Version: f.Version, Tags: tagStrings(f.Tags),
			path: filepath.Join(dir, name),
		})
	}
	if len(entries) == 0 {
		problems = append(problems, fmt.Errorf("wheelhouse %s is empty", dir))
	}
	sort.Slice(wheels, func(i, j int) bool { return wheels[i].File < wheels[j].File })
	return wheels, problems, nil
}

// Scan is List plus a check of every wheel: a readable zip whose RECORD
// matches its contents. It hashes each wheel (streaming) with up to Jobs
// in parallel and returns the wheels sorted by file name, or every
// problem at once. Wheels the cache knows unchanged since they last
// passed are not read.
func Scan(ctx context.Context, dir string, o ScanOptions) ([]Wheel, error) {
	// Check what can be checked even when some entries are bad, to
	// report every problem at once.
	wheels, problems, err := listDir(dir)
	if err != nil {
		return nil, err
	}
	ck := newChecker(o.Cache)
	errs := make([]error, len(wheels))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(o.Jobs, 1))
	for i := range wheels {
		g.Go(func() error {
			if gctx.Err() != nil {
				return gctx.Err()
			}
			errs[i] = ck.check(gctx, &wheels[i])
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	_ = ck.cache.save()
	if err := ctx.Err(); err != nil {
		// Cancelled: the wheels not yet checked are not problems.
		return nil, err
	}
	problems = append(problems, nonNil(errs)...)
	if len(problems) > 0 {
		return nil, &WheelhouseError{Dir: dir, Problems: problems}
	}
	return wheels, nil
}

// checker checks wheels, through the scan cache when it has one.
type checker struct {
	cache   *scanCache
	started time.Time
}

func newChecker(cacheFile string) *checker {
	return &checker{cache: loadScanCache(cacheFile), started: time.Now()}
}

// check fills in w's digest and size after checking the file, or from
// the cache when the file is unchanged since it last passed.
func (c *checker) check(ctx context.Context, w *Wheel) error {
	f, err := wheel.ParseFilename(w.File)
	if err != nil {
		return err
	}
	abs, _ := filepath.Abs(w.path)
	fi, err := os.Stat(w.path)
	if err != nil {
		return err
	}
	st, cacheable := statOf(fi)
	if cacheable {
		if sha, ok := c.cache.lookup(abs, st); ok {
			w.SHA256, w.Size = sha, st.Size
			return nil
		}
	}
	wheelsRead.Add(1)
	if err := checkWheelFile(ctx, w, f); err != nil {
		return err
	}
	if cacheable && w.Size == st.Size {
		c.cache.remember(abs, st, w.SHA256, c.started)
	}
	return nil
}

// checkWheelFile hashes the file and checks it (checkWheel).
func checkWheelFile(ctx context.Context, w *Wheel, f wheel.Filename) error {
	fh, err := os.Open(w.path)
	if err != nil {
		return err
	}
	defer fh.Close()
	h := sha256.New()
	n, err := checkWheel(ctx, fh, f, h)
	if err != nil {
		return err
	}
	w.SHA256, w.Size = hex.EncodeToString(h.Sum(nil)), n
	return nil
}

// checkWheel checks the wheel in fh, read from its current offset (the
// start), the one way push and pull check a wheel: its zip and RECORD in
// one sequential pass, hashing every byte into h when h is not nil, then
// the zip's central directory against what the pass saw
// (wheel.Streamed.Check). It returns how many bytes the pass read.
func checkWheel(ctx context.Context, fh *os.File, f wheel.Filename, h hash.Hash) (int64, error) {
	// The pass inflates deflated entries, seconds for a big wheel: it
	// stops soon after the pull or push is cancelled, or another wheel
	// failed.
	s, n, verr := wheel.VerifyStreamHash(ctxReader{ctx, fh}, f, h)
	var re *wheel.ReadError
	if errors.As(verr, &re) {
		return n, fmt.Errorf("wheel %s: %w", f.File, verr)
	}
	ra := ctxReaderAt{ctx, fh}
	switch {
	case errors.Is(verr, wheel.ErrNotStreamable):
		return n, wheel.VerifyReader(ra, n, f)
	case verr != nil:
		return n, verr
	}
	return n, s.Check(ra, n)
}

// ctxReader fails reads once ctx is done (see ctxReaderAt).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
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
