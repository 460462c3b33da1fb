package wheel

import (
	"archive/zip"
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"sync"

	"github.com/klauspost/compress/flate"
)

// ErrNotStreamable means the archive cannot be checked in one sequential
// pass (entries with data descriptors, unusual compression); the caller
// checks it with random access instead (Inspect).
var ErrNotStreamable = errors.New("wheel cannot be verified as a stream")

type streamEntry struct {
	dataOffset int64
	method     uint16
	crc        uint32
	csize      uint64
	usize      uint64
	sha256     string // urlsafe base64, no padding
}

// Streamed is what one sequential pass over a wheel learned; Check
// finishes the job against the archive's central directory.
type Streamed struct {
	entries map[string]*streamEntry
	record  []byte
	recName string
	f       Filename
	// localEnd is where the local entries end: the central directory
	// must start there (checkEnd).
	localEnd int64
}

const (
	sigLocal   = 0x04034b50
	sigCentral = 0x02014b50
	sigEnd     = 0x06054b50
	sigEnd64   = 0x06064b50
	// sigZip64Loc starts the zip64 end locator, between the zip64 end
	// record and the end record.
	sigZip64Loc = 0x07064b50
)

// VerifyStream reads a wheel sequentially from r to its end — so that it
// can run on bytes as they are hashed for upload — hashing every entry
// as it passes (deflated ones inflated on the way, on this goroutine).
// The archive's central directory, at its end, is checked afterwards
// with Streamed.Check, which needs random access to the same bytes (the
// file on disk). It reads r to EOF even when it gives up early, so a
// digest computed over r stays whole.
func VerifyStream(r io.Reader, f Filename) (*Streamed, error) {
	s, _, err := VerifyStreamHash(r, f, nil)
	return s, err
}

// VerifyStreamHash is VerifyStream that also writes every byte of r, in
// order, to whole (a blob's digest) and returns how many bytes r gave.
// whole may be nil.
func VerifyStreamHash(r io.Reader, f Filename, whole hash.Hash) (*Streamed, int64, error) {
	er := &errReader{r: r}
	cr := &countReader{r: bufio.NewReaderSize(er, 256<<10), whole: whole}
	if whole != nil {
		cr.pend = make([]byte, 0, 4096)
	}
	s, err := parseStream(cr, f)
	_, _ = io.Copy(io.Discard, cr)
	cr.flush()
	if er.err != nil {
		// The bytes did not arrive whole (network, digest check, disk):
		// that, not what the zip parser made of them, is the error.
		return nil, cr.n, &ReadError{Err: er.err}
	}
	return s, cr.n, err
}

// ReadError is a failure of the reader given to VerifyStream, as opposed
// to a problem with the wheel.
type ReadError struct{ Err error }

func (e *ReadError) Error() string { return e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// countReader counts what was consumed and, when whole is set, hashes
// it. It is an io.ByteReader so that flate reads exactly the compressed
// bytes and no further (data descriptors follow them).
type countReader struct {
	r     *bufio.Reader
	n     int64
	whole hash.Hash
	// pend holds bytes taken one at a time (flate's ReadByte) until
	// there are enough of them for one Write to whole.
	pend []byte
}

func (c *countReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
		if c.whole != nil {
			c.pend = append(c.pend, b)
			if len(c.pend) == cap(c.pend) {
				c.flush()
			}
		}
	}
	return b, err
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.whole != nil && n > 0 {
		c.flush()
		c.whole.Write(p[:n])
	}
	return n, err
}

// flush writes the bytes ReadByte kept to whole; every other write to
// whole comes after it, so whole sees the stream in order.
func (c *countReader) flush() {
	if len(c.pend) > 0 {
		c.whole.Write(c.pend)
		c.pend = c.pend[:0]
	}
}

// stored passes the n bytes of a stored entry to h (the entry's hash),
// to w and to whole, reading them in place in the buffer. It returns how
// many bytes it passed on; fewer than n only with an error.
func (c *countReader) stored(n int64, h hash.Hash, w io.Writer) (int64, error) {
	if c.whole != nil {
		c.flush()
	}
	var done int64
	for done < n {
		want := min(n-done, int64(c.r.Size()))
		b, err := c.r.Peek(int(want))
		if len(b) > 0 {
			if c.whole != nil {
				c.whole.Write(b)
			}
			h.Write(b)
			w.Write(b)
			c.r.Discard(len(b))
			c.n += int64(len(b))
			done += int64(len(b))
		}
		if int64(len(b)) < want {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return done, err
		}
	}
	return done, nil
}

func parseStream(cr *countReader, f Filename) (*Streamed, error) {
	s := &Streamed{entries: map[string]*streamEntry{}, f: f}
	var hdr [30]byte
	for {
		if _, err := io.ReadFull(cr, hdr[:4]); err != nil {
			return nil, fmt.Errorf("wheel %s: not a readable zip archive: %w", f.File, err)
		}
		switch binary.LittleEndian.Uint32(hdr[:4]) {
		case sigLocal:
		case sigCentral, sigEnd, sigEnd64:
			if len(s.entries) == 0 {
				return nil, fmt.Errorf("wheel %s: empty zip archive", f.File)
			}
			s.localEnd = cr.n - 4
			return s, nil
		default:
			return nil, fmt.Errorf("%w: unexpected data at offset %d", ErrNotStreamable, cr.n-4)
		}
		if _, err := io.ReadFull(cr, hdr[4:30]); err != nil {
			return nil, fmt.Errorf("wheel %s: not a readable zip archive: %w", f.File, err)
		}
		le := binary.LittleEndian
		flags, method := le.Uint16(hdr[6:]), le.Uint16(hdr[8:])
		e := &streamEntry{method: method, crc: le.Uint32(hdr[14:]), csize: uint64(le.Uint32(hdr[18:])), usize: uint64(le.Uint32(hdr[22:]))}
		nameLen, extraLen := int(le.Uint16(hdr[26:])), int(le.Uint16(hdr[28:]))
		descriptor := flags&0x8 != 0
		if flags&0x1 != 0 || (method != zip.Store && method != zip.Deflate) || (descriptor && method == zip.Store) {
			// Encryption, another codec, or stored data whose size
			// follows it: only random access can tell where it ends.
			return nil, ErrNotStreamable
		}
		buf := make([]byte, nameLen+extraLen)
		if _, err := io.ReadFull(cr, buf); err != nil {
			return nil, fmt.Errorf("wheel %s: not a readable zip archive: %w", f.File, err)
		}
		name := string(buf[:nameLen])
		if e.csize == 0xFFFFFFFF || e.usize == 0xFFFFFFFF {
			if !zip64Sizes(buf[nameLen:], e) {
				return nil, ErrNotStreamable
			}
		}
		if _, dup := s.entries[name]; dup {
			return nil, fmt.Errorf("wheel %s: entry %q appears twice in the archive", f.File, name)
		}
		e.dataOffset = cr.n
		var data io.Reader = io.LimitReader(cr, int64(e.csize))
		if descriptor {
			// The deflate stream ends itself; sizes and CRC follow it.
			data = cr
		}
		isRecord := isRecordName(name, f)
		h := sha256.New()
		crc := crc32.NewIEEE()
		var keep *limitedBuffer
		var rest io.Writer = crc // what sees the content besides h
		if isRecord {
			keep = &limitedBuffer{max: 64 << 20}
			rest = io.MultiWriter(crc, keep)
		}
		var n int64
		var err error
		switch {
		case method == zip.Store:
			// Not a copy through a buffer: hashed where it lies, and
			// with the whole-stream hash in the same pass.
			n, err = cr.stored(int64(e.csize), h, rest)
			data = eof{}
		case !descriptor:
			// Sizes in the local header (Python's zipfile writes them):
			// the compressed bytes go through cr.Read in bulk (counted
			// and hashed into whole a buffer at a time); whatever inflate
			// reads ahead is still inside this entry, and data's drain
			// below takes the rest, so whole sees every byte once, in
			// order.
			n, err = inflate(data, e.usize, io.MultiWriter(h, rest))
		default:
			// A data descriptor follows the deflate stream: flate must
			// stop on its last byte, so it reads one byte at a time.
			fr := getInflater(byteLimited{data, cr})
			n, err = io.Copy(io.MultiWriter(h, rest), fr)
			putInflater(fr)
		}
		if err != nil {
			return nil, fmt.Errorf("wheel %s: not a readable zip archive: %s: %w", f.File, name, err)
		}
		if descriptor {
			if err := readDescriptor(cr, e, zip64Extra(buf[nameLen:])); err != nil {
				return nil, fmt.Errorf("wheel %s: %s: %w", f.File, name, err)
			}
		} else if _, err := io.Copy(io.Discard, data); err != nil {
			// Whatever the codec left unread of the compressed data.
			return nil, fmt.Errorf("wheel %s: %s: %w", f.File, name, err)
		}
		if uint64(n) != e.usize || crc.Sum32() != e.crc || (!descriptor && cr.n != e.dataOffset+int64(e.csize)) {
			return nil, fmt.Errorf("wheel %s: %s: corrupt entry (size or CRC does not match its header)", f.File, name)
		}
		e.sha256 = base64.RawURLEncoding.EncodeToString(h.Sum(nil))
		s.entries[name] = e
		if isRecord {
			if keep.over {
				return nil, fmt.Errorf("wheel %s: RECORD larger than 64 MiB", f.File)
			}
			if s.recName != "" {
				return nil, fmt.Errorf("wheel %s: more than one .dist-info/RECORD", f.File)
			}
			s.record, s.recName = keep.b, name
		}
	}
}

// inflate writes what the deflate stream in src (an entry's compressed
// bytes and nothing after them: it reads ahead) inflates to into w,
// stopping one byte past usize, which is enough to refute a header: a
// deflate bomb is not inflated to its end. klauspost's inflater reads a
// bufio.Reader without an interface call per byte.
func inflate(src io.Reader, usize uint64, w io.Writer) (int64, error) {
	br := getBufio(src)
	defer putBufio(br)
	fr := getInflater(br)
	defer putInflater(fr)
	return io.Copy(w, io.LimitReader(fr, int64(usize)+1))
}

// Inflaters and their input buffers are reused across entries: a wheel
// such as torch's holds thousands of small files, and a fresh inflater
// (its 32 KiB window and tables) per file would cost more than the file.
var (
	inflaters = sync.Pool{}
	bufios    = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}
)

func getInflater(r io.Reader) io.ReadCloser {
	if f, ok := inflaters.Get().(io.ReadCloser); ok {
		if f.(flate.Resetter).Reset(r, nil) == nil {
			return f
		}
	}
	return flate.NewReader(r)
}

// putInflater drops the inflater's hold on the entry's reader (and so on
// the stream behind it) before pooling it.
func putInflater(f io.ReadCloser) {
	f.Close()
	f.(flate.Resetter).Reset(noBytes{}, nil)
	inflaters.Put(f)
}

// noBytes is an empty flate.Reader; Reset keeps it as it is, where a
// plain nil reader would be wrapped in a new bufio.Reader.
type noBytes struct{}

func (noBytes) Read([]byte) (int, error) { return 0, io.EOF }
func (noBytes) ReadByte() (byte, error)  { return 0, io.EOF }

func getBufio(r io.Reader) *bufio.Reader {
	b := bufios.Get().(*bufio.Reader)
	b.Reset(r)
	return b
}

func putBufio(b *bufio.Reader) {
	b.Reset(nil)
	bufios.Put(b)
}

type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }

// byteLimited gives flate a ByteReader over the limited data so it never
// reads past the entry.
type byteLimited struct {
	r  io.Reader
	cr *countReader
}

func (b byteLimited) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b byteLimited) ReadByte() (byte, error) {
	if lr, ok := b.r.(*io.LimitedReader); ok {
		if lr.N <= 0 {
			return 0, io.EOF
		}
		c, err := b.cr.ReadByte()
		if err == nil {
			lr.N--
		}
		return c, err
	}
	return b.cr.ReadByte()
}

// readDescriptor reads the data descriptor after a deflated entry and
// takes its CRC and sizes, which the local header left zero.
func readDescriptor(cr *countReader, e *streamEntry, zip64 bool) error {
	e.csize = uint64(cr.n - e.dataOffset)
	n := 12
	if zip64 {
		n = 20
	}
	b := make([]byte, 4+n)
	if _, err := io.ReadFull(cr, b[:4]); err != nil {
		return err
	}
	if binary.LittleEndian.Uint32(b) == 0x08074b50 {
		if _, err := io.ReadFull(cr, b[4:]); err != nil {
			return err
		}
		b = b[4:]
	} else if _, err := io.ReadFull(cr, b[4:n]); err != nil {
		return err
	}
	e.crc = binary.LittleEndian.Uint32(b)
	var csize, usize uint64
	if zip64 {
		csize, usize = binary.LittleEndian.Uint64(b[4:]), binary.LittleEndian.Uint64(b[12:])
	} else {
		csize, usize = uint64(binary.LittleEndian.Uint32(b[4:])), uint64(binary.LittleEndian.Uint32(b[8:]))
	}
	if csize != e.csize {
		return errors.New("corrupt entry (data descriptor size does not match the data)")
	}
	e.usize = usize
	return nil
}

func zip64Extra(extra []byte) bool {
	for len(extra) >= 4 {
		tag, size := binary.LittleEndian.Uint16(extra), int(binary.LittleEndian.Uint16(extra[2:]))
		if tag == 0x0001 {
			return true
		}
		if size+4 > len(extra) {
			return false
		}
		extra = extra[4+size:]
	}
	return false
}

func zip64Sizes(extra []byte, e *streamEntry) bool {
	for len(extra) >= 4 {
		tag, size := binary.LittleEndian.Uint16(extra), int(binary.LittleEndian.Uint16(extra[2:]))
		extra = extra[4:]
		if size > len(extra) {
			return false
		}
		if tag == 0x0001 {
			b := extra[:size]
			if e.usize == 0xFFFFFFFF {
				if len(b) < 8 {
					return false
				}
				e.usize, b = binary.LittleEndian.Uint64(b), b[8:]
			}
			if e.csize == 0xFFFFFFFF {
				if len(b) < 8 {
					return false
				}
				e.csize = binary.LittleEndian.Uint64(b)
			}
			return true
		}
		extra = extra[size:]
	}
	return false
}

type limitedBuffer struct {
	b    []byte
	max  int
	over bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > l.max {
		l.over = true
		return len(p), nil
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

// Check compares the streamed entries with the central directory of the
// same bytes (r, size) — the directory is what pip reads, so an entry the
// stream saw must be exactly the entry pip will extract — and then checks
// RECORD with the hashes taken in the stream. It reads nothing but the
// directory.
func (s *Streamed) Check(r io.ReaderAt, size int64) error {
	f := s.f
	zr, err := openZip(r, size, f, s.localEnd)
	if err != nil {
		return err
	}
	if len(zr.File) != len(s.entries) {
		return fmt.Errorf("wheel %s: the central directory lists %d entries, the archive holds %d", f.File, len(zr.File), len(s.entries))
	}
	files := map[string]*zip.File{}
	var record *zip.File
	for _, zf := range zr.File {
		if err := checkName(zf, f); err != nil {
			return err
		}
		e, ok := s.entries[zf.Name]
		if !ok {
			return fmt.Errorf("wheel %s: %s is in the central directory but not in the archive", f.File, zf.Name)
		}
		if _, dup := files[zf.Name]; dup {
			return fmt.Errorf("wheel %s: entry %q appears twice in the archive", f.File, zf.Name)
		}
		off, err := zf.DataOffset()
		if err != nil || off != e.dataOffset || zf.CRC32 != e.crc || zf.CompressedSize64 != e.csize || zf.UncompressedSize64 != e.usize || zf.Method != e.method {
			return fmt.Errorf("wheel %s: %s: central directory and local header disagree", f.File, zf.Name)
		}
		files[zf.Name] = zf
		if zf.Name == s.recName {
			record = zf
		}
	}
	if record == nil {
		return fmt.Errorf("wheel %s: no %s-%s.dist-info/RECORD (not a valid wheel)", f.File, f.Distribution, f.Version)
	}
	entries, err := parseRecord(s.record)
	if err != nil {
		return fmt.Errorf("wheel %s: %s: %w", f.File, record.Name, err)
	}
	return checkRecord(f, files, record, entries, func(zf *zip.File, e recordEntry) error {
		if e.algo != "sha256" {
			return checkEntry(zf, e)
		}
		se := s.entries[zf.Name]
		if se.sha256 != trimPad(e.digest) {
			return fmt.Errorf("RECORD says sha256=%s but the file hashes to sha256=%s", e.digest, se.sha256)
		}
		if e.hasSize && uint64(e.size) != se.usize {
			return fmt.Errorf("RECORD says %d bytes but the file has %d", e.size, se.usize)
		}
		return nil
	})
}

func isRecordName(name string, f Filename) bool {
	dir, base, ok := cutLast(name, "/")
	if !ok || base != "RECORD" {
		return false
	}
	distInfo, ok := cutSuffix(dir, ".dist-info")
	if !ok || len(distInfo) == 0 {
		return false
	}
	for i := len(distInfo) - 1; i > 0; i-- {
		if distInfo[i] == '-' {
			return NormalizeName(distInfo[:i]) == f.Name()
		}
	}
	return false
}
