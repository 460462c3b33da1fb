package workdir

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Unpack extracts a tar or tar.gz into dir under lim (zero fields take the
// defaults). The broker checks the limits at submit; the agent checks them
// again here so that a broker with other limits, or an archive that did
// not come through one, cannot fill the node's disk or inodes. Only
// regular files and directories are written (modes keep the owner's
// read-write and drop group and other write), and no entry may leave dir.
func Unpack(archive []byte, dir string, lim Limits) error {
	fail := func(err error) error { return fmt.Errorf("unpacking the run's workdir archive: %w", err) }
	tr, err := NewReader(bytes.NewReader(archive), lim.WithDefaults())
	if err != nil {
		return fail(err)
	}
	defer tr.Close()
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fail(err)
		}
		// Counter refused names that leave the work dir.
		path := filepath.Join(dir, filepath.Clean(filepath.FromSlash(h.Name)))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return fail(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return fail(err)
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				return fail(err)
			}
			_, err = io.Copy(f, io.LimitReader(tr, h.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fail(fmt.Errorf("%s: %w", h.Name, err))
			}
		default:
			// Links and devices are skipped: a link could point out of
			// the work dir.
		}
	}
}
