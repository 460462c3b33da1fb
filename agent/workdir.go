package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// maxWorkdirBytes bounds what an archive may unpack to, so a hostile or
// broken archive cannot fill the node's disk.
const maxWorkdirBytes = 1 << 30

// unpackWorkdir extracts a tar or tar.gz into dir. Only regular files and
// directories are written, and no entry may leave dir.
func unpackWorkdir(archive []byte, dir string) error {
	var r io.Reader = bytes.NewReader(archive)
	if len(archive) > 2 && archive[0] == 0x1f && archive[1] == 0x8b {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("unpacking the run's workdir archive: %w", err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("unpacking the run's workdir archive: %w", err)
		}
		name := filepath.Clean(filepath.FromSlash(h.Name))
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, ".."+string(filepath.Separator)) {
			return fmt.Errorf("unpacking the run's workdir archive: entry %q leaves the work dir", h.Name)
		}
		path := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return fmt.Errorf("unpacking the run's workdir archive: %w", err)
			}
		case tar.TypeReg:
			total += h.Size
			if total > maxWorkdirBytes {
				return fmt.Errorf("unpacking the run's workdir archive: more than %d bytes", maxWorkdirBytes)
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return fmt.Errorf("unpacking the run's workdir archive: %w", err)
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				return fmt.Errorf("unpacking the run's workdir archive: %w", err)
			}
			_, err = io.Copy(f, io.LimitReader(tr, h.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("unpacking the run's workdir archive: %s: %w", h.Name, err)
			}
		default:
			// Links and devices are skipped: a link could point out of
			// the work dir.
		}
	}
}
