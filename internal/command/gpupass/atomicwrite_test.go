package gpupass

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// The files below are replaced through fsutil.WriteFileAtomic. A crash
// cannot be staged in a test; what can be checked is that the old file
// is never written through (its inode, kept by a hard link, is intact),
// that no fixed temporary name is followed, and the final mode.

func TestWriteFileReplacesAtomically(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "report.md")
	if err := os.WriteFile(path, []byte("old report\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A stale or planted path+".tmp" symlink must not be written through.
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("victim\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, path+".tmp"); err != nil {
		t.Fatal(err)
	}

	errRender := errors.New("render failed")
	if err := writeFile(path, func(w io.Writer) error {
		io.WriteString(w, "half")
		return errRender
	}); !errors.Is(err, errRender) {
		t.Fatalf("failing render: err %v, want %v", err, errRender)
	}
	testutil.WantFile(t, path, "old report\n", 0o644)

	if err := writeFile(path, func(w io.Writer) error {
		_, err := io.WriteString(w, "new report\n")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testutil.WantFile(t, path, "new report\n", 0o644)
	testutil.WantFile(t, victim, "victim\n", 0o644)
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() {
		t.Errorf("%s: mode %v after the write, want a regular file", path, fi.Mode())
	}
}

func TestWriteLocalConfigReplacesAtomically(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, LocalConfigFile)
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("victim\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, path+".tmp"); err != nil {
		t.Fatal(err)
	}
	if _, err := writeLocalConfig(dir, &LocalConfig{BrokerURL: "http://127.0.0.1:7070", Token: "gpp_secret"}); err != nil {
		t.Fatal(err)
	}
	testutil.WantFile(t, victim, "victim\n", 0o644)
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("config.json: mode %v, want a regular file, mode 0600", fi.Mode())
	}
}
