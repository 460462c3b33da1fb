// Package fsutil holds the one way gpupass replaces a file on disk and
// the one walk up a project's directories.
// Stdlib only, so every binary (the agent included) may import it.
package fsutil

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces path with data, mode perm: it writes a
// temporary file in the same directory, fsyncs it, renames it over path and
// fsyncs the directory. A crash at any point leaves either the old file or
// the new one, never a truncated file under the final name — which matters
// for identity keys, spool acknowledgements and specs alike.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	fail := func(err error) error {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("writing %s: syncing directory: %w", path, err)
	}
	return nil
}

// FindUp walks from start up to the first directory match holds and
// returns it as an absolute path; "" when none does. It looks in start
// and each parent, and stops after the first directory that is a git
// work tree's root (has .git: what is above belongs to no project of
// this one), after home (nothing above $HOME is a user's project), or at
// the filesystem root. One walk for every search of a project's files
// (its .gpupass, its spec), so that they stop at the same places.
func FindUp(start, home string, match func(dir string) bool) string {
	dir, err := filepath.Abs(start)
	if err != nil {
		return ""
	}
	if home != "" {
		if h, err := filepath.Abs(home); err == nil {
			home = h
		}
	}
	for {
		if match(dir) {
			return dir
		}
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil || dir == home {
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}
