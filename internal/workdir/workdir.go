// Package workdir is a run's work dir archive (the tar.gz that `gpupass
// train --workdir` ships): Pack and Unpack, the one set of limits on it
// and the streaming reader that enforces them. The CLI checks them while
// packing, the broker at Submit before it stores the archive (with Reader
// alone: it writes no files), and the agent again while unpacking: an
// archive of a few megabytes can otherwise ask for hundreds of thousands
// of inodes or gigabytes of disk.
package workdir

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// Limits bound what one archive may unpack to. Zero fields take the
// defaults (see Default).
type Limits struct {
	// MaxEntries bounds files, directories and skipped entries (links,
	// devices) together: each costs an inode or a header to read.
	MaxEntries int
	// MaxDepth bounds the path components of an entry ("a/b/c" is 3).
	MaxDepth int
	// MaxBytes bounds the file content the archive unpacks to.
	MaxBytes int64
	// MaxPath bounds an entry's name in bytes.
	MaxPath int
}

// Defaults: a training directory holds code and small inputs (data comes
// from storage), far below these; 300,000 empty files (an inode bomb of
// 1.9 MB compressed) are not.
const (
	DefaultMaxEntries = 50_000
	DefaultMaxDepth   = 32
	DefaultMaxBytes   = 1 << 30
	DefaultMaxPath    = 1024
)

// nameMax is the longest file name component Linux file systems take.
const nameMax = 255

// headerSlack is what one entry may add to the tar stream besides its
// content: its header block, a PAX header for a long name and the
// padding of its content to 512 bytes.
const headerSlack = 4 << 10

// Default returns the default limits.
func Default() Limits {
	return Limits{MaxEntries: DefaultMaxEntries, MaxDepth: DefaultMaxDepth, MaxBytes: DefaultMaxBytes, MaxPath: DefaultMaxPath}
}

// WithDefaults fills zero fields from Default.
func (l Limits) WithDefaults() Limits {
	d := Default()
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = d.MaxDepth
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxPath <= 0 {
		l.MaxPath = d.MaxPath
	}
	return l
}

// String is how errors and logs show the limits.
func (l Limits) String() string {
	return fmt.Sprintf("%d entries, depth %d, %d bytes unpacked, %d-byte paths", l.MaxEntries, l.MaxDepth, l.MaxBytes, l.MaxPath)
}

// LimitError says which limit an archive broke; callers add where the
// limit is configured.
type LimitError struct {
	Limit string // "entries", "depth", "bytes" or "path"
	Max   int64
	Entry string // the entry that broke it
}

func (e *LimitError) Error() string {
	switch e.Limit {
	case "entries":
		return fmt.Sprintf("more than %d entries (files and directories); at %q", e.Max, e.Entry)
	case "depth":
		return fmt.Sprintf("entry %q is more than %d directories deep", e.Entry, e.Max)
	case "path":
		return fmt.Sprintf("entry %.64q… has a name longer than %d bytes", e.Entry, e.Max)
	default:
		return fmt.Sprintf("more than %d bytes unpacked; at %q", e.Max, e.Entry)
	}
}

// Counter applies Limits to entries one at a time; the CLI uses it while
// packing, Reader while reading.
type Counter struct {
	l       Limits
	entries int
	bytes   int64
}

// NewCounter returns a Counter for l (zero fields take the defaults).
func NewCounter(l Limits) *Counter { return &Counter{l: l.WithDefaults()} }

// Add counts one entry named name (slash-separated, relative) with size
// bytes of content, and says whether it breaks a limit or is not a safe
// relative path.
func (c *Counter) Add(name string, size int64) error {
	c.entries++
	if c.entries > c.l.MaxEntries {
		return &LimitError{Limit: "entries", Max: int64(c.l.MaxEntries), Entry: name}
	}
	if len(name) > c.l.MaxPath {
		return &LimitError{Limit: "path", Max: int64(c.l.MaxPath), Entry: name}
	}
	clean := path.Clean(strings.TrimSuffix(name, "/"))
	if strings.HasPrefix(name, "/") || clean == ".." || strings.HasPrefix(clean, "../") || strings.ContainsRune(name, 0) {
		return fmt.Errorf("entry %q leaves the work dir", name)
	}
	depth := 0
	for _, part := range strings.Split(clean, "/") {
		if len(part) > nameMax {
			return &LimitError{Limit: "path", Max: nameMax, Entry: name}
		}
		if part != "." {
			depth++
		}
	}
	if depth > c.l.MaxDepth {
		return &LimitError{Limit: "depth", Max: int64(c.l.MaxDepth), Entry: name}
	}
	if size < 0 {
		return fmt.Errorf("entry %q has a negative size", name)
	}
	c.bytes += size
	if c.bytes > c.l.MaxBytes || c.bytes < 0 {
		return &LimitError{Limit: "bytes", Max: c.l.MaxBytes, Entry: name}
	}
	return nil
}

// Reader reads a tar or gzip'd tar archive entry by entry under Limits.
// Besides the limits on entries, it bounds the bytes inflated from the
// gzip stream (content plus headerSlack per entry allowed), so the work
// of reading an archive to its end is bounded by the limits, not by what
// the archive's compression ratio makes of its size.
type Reader struct {
	tr *tar.Reader
	c  *Counter
	zr *gzip.Reader
}

// NewReader starts reading archive r (gzip'd or plain tar).
func NewReader(r io.Reader, l Limits) (*Reader, error) {
	l = l.WithDefaults()
	br := bufio.NewReader(r)
	var src io.Reader = br
	rd := &Reader{c: NewCounter(l)}
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		zr.Multistream(false)
		rd.zr, src = zr, zr
	}
	stream := l.MaxBytes + int64(l.MaxEntries+2)*headerSlack
	rd.tr = tar.NewReader(&capReader{r: src, left: stream, max: stream})
	return rd, nil
}

// Next returns the next entry's header, or io.EOF after the last.
func (r *Reader) Next() (*tar.Header, error) {
	h, err := r.tr.Next()
	if err != nil {
		return nil, err
	}
	// Content of any entry type is inflated to be skipped, so every
	// size counts.
	if err := r.c.Add(h.Name, h.Size); err != nil {
		return nil, err
	}
	return h, nil
}

// Read reads the current entry's content.
func (r *Reader) Read(p []byte) (int, error) { return r.tr.Read(p) }

// Close releases the gzip reader; it does not close the source.
func (r *Reader) Close() error {
	if r.zr != nil {
		return r.zr.Close()
	}
	return nil
}

// Check reads a whole archive under l and returns how many entries and
// content bytes it holds, or the first limit it breaks.
func Check(r io.Reader, l Limits) (entries int, bytes int64, err error) {
	rd, err := NewReader(r, l)
	if err != nil {
		return 0, 0, err
	}
	defer rd.Close()
	for {
		if _, err := rd.Next(); err != nil {
			if errors.Is(err, io.EOF) {
				return rd.c.entries, rd.c.bytes, nil
			}
			return rd.c.entries, rd.c.bytes, err
		}
	}
}

// capReader fails once more than max bytes were read through it.
type capReader struct {
	r         io.Reader
	left, max int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("the tar stream is longer than %d bytes, more than the limits allow", c.max)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}
