package gpupass_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/workdir"
)

// TestArchiveDirWhileAFileGrows: a file another process appends to while
// the work dir is packed (two CI jobs sharing a checkout) is shipped as it
// was when it was seen, not refused with "archive/tar: write too long".
func TestArchiveDirWhileAFileGrows(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "train.py"), []byte("print('hi')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "job.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	// The writer stops at 16 MiB; packing runs while it writes.
	done := make(chan struct{})
	go func() {
		defer close(done)
		line := append(bytes.Repeat([]byte("x"), 4095), '\n')
		for i := 0; i < 4096; i++ {
			if _, err := log.Write(line); err != nil {
				return
			}
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			if i > 0 {
				return
			}
		default:
		}
		b, err := gpupass.ArchiveDir(dir)
		if err != nil {
			<-done
			t.Fatalf("pack %d: %v", i, err)
		}
		names := tarNames(t, b)
		if !slices.Contains(names, "train.py") || !slices.Contains(names, "job.log") {
			t.Fatalf("pack %d holds %v", i, names)
		}
	}
}

// tarNames lists the entries of a gzip tar and checks each body's size.
func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, tr); err != nil || n != h.Size {
			t.Fatalf("%s holds %d of %d bytes (%v)", h.Name, n, h.Size, err)
		}
		names = append(names, h.Name)
	}
}

// One packer serves train --workdir and the demo: it ships the project,
// hidden files included, and leaves out history and Python bytecode; a
// link is refused by name rather than followed out of the directory.
func TestArchiveDirShipsTheProject(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, f := range []string{"train.py", ".python-version", "data/x.csv", "pkg/__pycache__/m.cpython-311.pyc", ".git/HEAD", "pkg/m.py"} {
		p := filepath.Join(dir, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := gpupass.ArchiveDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := tarNames(t, b)
	slices.Sort(got)
	want := []string{".python-version", "data", "data/x.csv", "pkg", "pkg/m.py", "train.py"}
	if !slices.Equal(got, want) {
		t.Fatalf("packed %v, want %v", got, want)
	}

	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "data", "leak")); err != nil {
		t.Fatal(err)
	}
	_, err = gpupass.ArchiveDir(dir)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "data", "leak")) || !strings.Contains(err.Error(), "links") {
		t.Fatalf("a link in the work dir: err %v, want one that names it", err)
	}
}

// The demo ships the example project with the same packer.
func TestArchiveDirPacksTheExample(t *testing.T) {
	t.Parallel()
	b, err := gpupass.ArchiveDir(filepath.Join("..", "..", "..", "examples", "train"))
	if err != nil {
		t.Fatal(err)
	}
	got := tarNames(t, b)
	for _, f := range []string{"gpupass.yaml", "train.py"} {
		if !slices.Contains(got, f) {
			t.Fatalf("the example's pack %v lacks %s", got, f)
		}
	}
}

// TestArchiveDirLimits: a directory over a work dir limit fails while it
// is packed, naming the directory and the flag that raises the limit,
// before anything is sent (issue #16, finding 7).
func TestArchiveDirLimits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deep := filepath.Join(dir, "a", "b", "c", "d")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		limits workdir.Limits
		want   string
	}{
		{workdir.Limits{MaxEntries: 10}, "more than 10 entries"},
		{workdir.Limits{MaxDepth: 3}, "more than 3 directories deep"},
	} {
		_, err := gpupass.ArchiveDirLimits(dir, tc.limits)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "--workdir-max-") {
			t.Errorf("limits %+v: err = %v; want one naming %s, saying %q and the --workdir-max- flag", tc.limits, err, dir, tc.want)
		}
	}
	if _, err := gpupass.ArchiveDirLimits(dir, workdir.Limits{}); err != nil {
		t.Errorf("default limits: %v", err)
	}
}
