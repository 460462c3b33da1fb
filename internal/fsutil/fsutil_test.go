package fsutil

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "key.pem")
	if err := WriteFileAtomic(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "two" {
		t.Fatalf("read %q, %v; want two", b, err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %04o, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "x"), nil, 0o644); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

// TestFindUp: the walk looks in start and each parent, and stops after a
// git work tree's root and after home.
func TestFindUp(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) string {
		t.Helper()
		d := filepath.Join(root, p)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	deep := mk("home/u/proj/a/b")
	mk("home/u/proj/.git")
	mk("home/u/proj/a/mark")
	mk("home/mark") // above home: never found
	has := func(d string) bool { _, err := os.Stat(filepath.Join(d, "mark")); return err == nil }
	home := filepath.Join(root, "home/u")
	if got, want := FindUp(deep, home, has), filepath.Join(root, "home/u/proj/a"); got != want {
		t.Errorf("FindUp from %s = %q, want %q", deep, got, want)
	}
	if got := FindUp(filepath.Join(root, "home/u/proj"), home, has); got != "" {
		t.Errorf("FindUp from a work tree's root found %q above it", got)
	}
	if err := os.Remove(filepath.Join(root, "home/u/proj/.git")); err != nil {
		t.Fatal(err)
	}
	if got := FindUp(filepath.Join(root, "home/u/proj"), home, has); got != "" {
		t.Errorf("FindUp found %q above home", got)
	}
	if got, want := FindUp(filepath.Join(root, "home/u/proj"), "", has), filepath.Join(root, "home"); got != want {
		t.Errorf("FindUp without a home = %q, want %q", got, want)
	}
}
