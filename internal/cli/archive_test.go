package cli_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/cli"
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
		b, err := cli.ArchiveDir(dir)
		if err != nil {
			<-done
			t.Fatalf("pack %d: %v", i, err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		names := map[string]bool{}
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("pack %d: %v", i, err)
			}
			if n, err := io.Copy(io.Discard, tr); err != nil || n != h.Size {
				t.Fatalf("pack %d: %s holds %d of %d bytes (%v)", i, h.Name, n, h.Size, err)
			}
			names[h.Name] = true
		}
		if !names["train.py"] || !names["job.log"] {
			t.Fatalf("pack %d holds %v", i, names)
		}
	}
}
