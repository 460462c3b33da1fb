package audit

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// zipTime is the fixed modification time of every entry: the zip format
// cannot express an earlier one, and a fixed value keeps the bytes of a
// report independent of when it was built.
var zipTime = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)

func writeZip(files []file) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	// Pin the compressor so the bytes do not depend on a default level.
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(w, flate.DefaultCompression)
	})
	for _, f := range files {
		h := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: zipTime}
		h.SetMode(0o644)
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, fmt.Errorf("writing %s to zip: %w", f.name, err)
		}
		if _, err := w.Write(f.data); err != nil {
			return nil, fmt.Errorf("writing %s to zip: %w", f.name, err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("closing zip: %w", err)
	}
	return buf.Bytes(), nil
}

// Limits bound what reading an audit report may cost, so a hostile zip
// (a bomb, thousands of entries) fails cleanly instead of exhausting
// memory.
type Limits struct {
	MaxEntries   int
	MaxFileBytes int64 // uncompressed, per entry
	MaxTotal     int64 // uncompressed, all entries
}

// DefaultLimits are far above any real report (a report with 100,000
// metric points is well under 1 MiB) and far below harm. A run across
// 1024 nodes adds three entries a rank.
var DefaultLimits = Limits{MaxEntries: 64 + 3*maxGangNodes, MaxFileBytes: 64 << 20, MaxTotal: 256 << 20}

// ErrUnsafeArchive marks an archive rejected before its content was
// trusted: bad names, too large, too many entries.
var ErrUnsafeArchive = errors.New("unsafe archive")

// readZip reads every entry into memory. Nothing is written to disk; the
// name checks still refuse anything that would be dangerous to extract
// (absolute paths, "..", directories, links, duplicates), because a
// report that carries such an entry was not made by gpupass.
func readZip(b []byte, lim Limits) (map[string][]byte, []string, error) {
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, nil, fmt.Errorf("not a zip archive: %w", err)
	}
	if len(zr.File) > lim.MaxEntries {
		return nil, nil, fmt.Errorf("%w: %d entries, at most %d allowed", ErrUnsafeArchive, len(zr.File), lim.MaxEntries)
	}
	out := map[string][]byte{}
	var order []string
	var total int64
	for _, f := range zr.File {
		if err := checkName(f.Name); err != nil {
			return nil, nil, fmt.Errorf("%w: entry %q: %v", ErrUnsafeArchive, f.Name, err)
		}
		if !f.Mode().IsRegular() {
			return nil, nil, fmt.Errorf("%w: entry %q is not a regular file (mode %s)", ErrUnsafeArchive, f.Name, f.Mode())
		}
		if _, dup := out[f.Name]; dup {
			return nil, nil, fmt.Errorf("%w: entry %q appears twice", ErrUnsafeArchive, f.Name)
		}
		if f.UncompressedSize64 > uint64(lim.MaxFileBytes) {
			return nil, nil, fmt.Errorf("%w: entry %q declares %d bytes, at most %d allowed (zip bomb?)", ErrUnsafeArchive, f.Name, f.UncompressedSize64, lim.MaxFileBytes)
		}
		rc, err := f.Open()
		if err != nil {
			return nil, nil, fmt.Errorf("%w: entry %q: %v", ErrUnsafeArchive, f.Name, err)
		}
		// Never trust the declared size: read one byte past the limit
		// to catch an entry that lies about it.
		data, err := io.ReadAll(io.LimitReader(rc, lim.MaxFileBytes+1))
		rc.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("%w: entry %q: %v", ErrUnsafeArchive, f.Name, err)
		}
		if int64(len(data)) > lim.MaxFileBytes {
			return nil, nil, fmt.Errorf("%w: entry %q inflates past %d bytes (zip bomb)", ErrUnsafeArchive, f.Name, lim.MaxFileBytes)
		}
		total += int64(len(data))
		if total > lim.MaxTotal {
			return nil, nil, fmt.Errorf("%w: entries inflate past %d bytes in total (zip bomb)", ErrUnsafeArchive, lim.MaxTotal)
		}
		out[f.Name] = data
		order = append(order, f.Name)
	}
	return out, order, nil
}

// checkName accepts only the flat, plain file names gpupass writes.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case strings.ContainsAny(name, "/\\"):
		return errors.New("path separators are not allowed (path traversal?)")
	case name == "." || name == ".." || strings.Contains(name, ".."):
		return errors.New(`".." is not allowed (path traversal)`)
	case strings.ContainsAny(name, ":\x00"):
		return errors.New("drive letters and NUL are not allowed")
	case len(name) > 128:
		return errors.New("name longer than 128 bytes")
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return errors.New("control characters are not allowed")
		}
	}
	return nil
}

// Extract writes the entries of an audit report into dir (created if
// needed) for a person to read. Names pass the same checks as Verify, and
// writes go through an os.Root so nothing can land outside dir, not even
// through a symlink planted there; existing files are never overwritten.
func Extract(zipBytes []byte, dir string, lim Limits) ([]string, error) {
	if lim == (Limits{}) {
		lim = DefaultLimits
	}
	files, order, err := readZip(zipBytes, lim)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("extracting: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("extracting: %w", err)
	}
	defer root.Close()
	for _, name := range order {
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return nil, fmt.Errorf("extracting %s: %w", name, err)
		}
		_, werr := f.Write(files[name])
		cerr := f.Close()
		if werr != nil || cerr != nil {
			return nil, fmt.Errorf("extracting %s: %w", name, errors.Join(werr, cerr))
		}
	}
	return order, nil
}
