package workdir

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// TooLargeError is an archive that packs to more than the compressed size
// allowed (the broker's request limit, less room for the rest of a
// Submit).
type TooLargeError struct{ MaxBytes int }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("more than %d MiB compressed; ship less (e.g. data from storage, not the work dir)", e.MaxBytes>>20)
}

// Pack packs a run's work dir as a gzip tar of regular files and
// directories. .git and __pycache__ are left out: history is not the
// run's, and bytecode is rebuilt for the node's Python. Links are refused
// rather than followed out of dir. The limits (entries, depth, bytes, path
// length) are checked as it goes, so a directory the broker would refuse
// fails here, early, with a *LimitError; more than maxCompressed bytes of
// archive is a *TooLargeError.
func Pack(dir string, l Limits, maxCompressed int) ([]byte, error) {
	count := NewCounter(l)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "__pycache__") {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !d.IsDir() && !info.Mode().IsRegular() {
			return fmt.Errorf("%s: only regular files and directories can be shipped (links and devices cannot)", path)
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := count.Add(hdr.Name, hdr.Size); err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		// The header holds the size seen a moment ago; a file another
		// process writes meanwhile (a log, a CI job's output next door) is
		// shipped as it was then, and one that shrank is refused.
		n, err := io.Copy(tw, io.LimitReader(f, hdr.Size))
		if err != nil {
			return err
		}
		if n < hdr.Size {
			return fmt.Errorf("%s shrank from %d to %d bytes while it was packed: stop what writes to it, or ship a directory nothing writes to", path, hdr.Size, n)
		}
		if buf.Len() > maxCompressed {
			return &TooLargeError{MaxBytes: maxCompressed}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("packing %s: %w", dir, err)
	}
	return buf.Bytes(), nil
}
