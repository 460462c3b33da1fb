package wheel

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Go's archive/zip and Python's zipfile (so pip) do not always find the
// same central directory in one file. Python shifts every offset by the
// bytes in front of the archive ("concat": the end record's position
// minus the directory's size and offset), and honours a zip64 end record
// in front of the end record even when nothing needs it; Go takes the
// directory at its stated offset when a header is there, and ignores an
// unneeded zip64 record. A wheel laid out as
// [entries][directory A][hidden entries][directory B][end] can then pass
// every check here, against A, while pip installs B's files. So the
// archive's end must be unambiguous before anything is trusted:
//
//   - one end record, the last in the file, its comment running exactly
//     to the end of the file;
//   - a zip64 locator and record only as zip64 writes them: right in
//     front of the end record, the record right in front of the locator,
//     and their values agreeing with the end record's unless those are
//     saturated;
//   - the central directory ending exactly where the (zip64) end record
//     starts (no data in between, nothing to shift), and holding exactly
//     the number of entries the end record says, header after header.
//
// The wheels the tests build satisfy it: Go's archive/zip (wheeltest),
// Python's zipfile (the bench's) and pip wheel with setuptools (the
// end-to-end tests); any writer that puts one directory after the
// entries and one end record after it does.

const (
	endLen        = 22 // end of central directory record, without comment
	zip64LocLen   = 20
	zip64EndLen   = 56 // zip64 end record, without extensible data
	centralHdrLen = 46
	maxComment    = 0xffff
)

// directory is where a checked archive's central directory lies.
type directory struct {
	offset, size, entries int64
}

// ambiguous says an archive's end leaves open which files an installer
// reads.
func ambiguous(f Filename, format string, a ...any) error {
	return fmt.Errorf("wheel %s: ambiguous zip archive: %s (an installer could read other files than the ones checked; rebuild the wheel)", f.File, fmt.Sprintf(format, a...))
}

// openZip reads the central directory of the archive r of size bytes
// once its end is unambiguous (checkEnd). start, when not negative, is
// where the directory must begin: where the entries a stream read end.
func openZip(r io.ReaderAt, size int64, f Filename, start int64) (*zip.Reader, error) {
	d, err := checkEnd(r, size, f)
	if err != nil {
		return nil, err
	}
	if start >= 0 && d.offset != start {
		return nil, ambiguous(f, "the central directory starts at offset %d, but the entries end at %d", d.offset, start)
	}
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("wheel %s: not a readable zip archive: %w", f.File, err)
	}
	return zr, nil
}

// checkEnd finds and checks the end of the archive r of size bytes (see
// above) and returns its central directory.
func checkEnd(r io.ReaderAt, size int64, f Filename) (directory, error) {
	fail := func(format string, a ...any) (directory, error) {
		return directory{}, ambiguous(f, format, a...)
	}
	if size < endLen {
		return directory{}, fmt.Errorf("wheel %s: not a readable zip archive: %d bytes", f.File, size)
	}
	tailLen := min(size, endLen+maxComment)
	tail := make([]byte, tailLen)
	if _, err := r.ReadAt(tail, size-tailLen); err != nil && !errors.Is(err, io.EOF) {
		return directory{}, fmt.Errorf("wheel %s: reading the end of the archive: %w", f.File, err)
	}
	i := bytes.LastIndex(tail, binary.LittleEndian.AppendUint32(nil, sigEnd))
	if i < 0 {
		return directory{}, fmt.Errorf("wheel %s: not a readable zip archive: no end of central directory record", f.File)
	}
	if len(tail)-i < endLen {
		return fail("an end record signature %d bytes from the end of the file", len(tail)-i)
	}
	le := binary.LittleEndian
	end := tail[i:]
	endPos := size - tailLen + int64(i)
	if comment := int(le.Uint16(end[20:])); endLen+comment != len(end) {
		return fail("the end record's comment of %d bytes does not run to the end of the file (%d bytes follow the record)", comment, len(end)-endLen)
	}
	if le.Uint16(end[4:]) != 0 || le.Uint16(end[6:]) != 0 || le.Uint16(end[8:]) != le.Uint16(end[10:]) {
		return fail("a multi-disk archive")
	}
	entries, cdSize, cdOffset := int64(le.Uint16(end[10:])), int64(le.Uint32(end[12:])), int64(le.Uint32(end[16:]))
	cdEnd := endPos // where the directory must end
	// The zip64 locator sits just before the end record: usually in the
	// tail already read; read apart only behind a near-64 KiB comment
	// (Python honours a locator wherever the end record puts it).
	if endPos >= zip64LocLen {
		loc := make([]byte, zip64LocLen)
		if i >= zip64LocLen {
			loc = tail[i-zip64LocLen : i]
		} else if _, err := r.ReadAt(loc, endPos-zip64LocLen); err != nil {
			return directory{}, fmt.Errorf("wheel %s: reading the end of the archive: %w", f.File, err)
		}
		if le.Uint32(loc) == sigZip64Loc {
			d, recPos, err := zip64End(r, loc, endPos, entries, cdSize, cdOffset)
			if err != nil {
				return fail("%v", err)
			}
			entries, cdSize, cdOffset, cdEnd = d.entries, d.size, d.offset, recPos
		}
	}
	if entries == 0xffff || cdSize == 0xffffffff || cdOffset == 0xffffffff {
		return fail("the end record's fields are saturated, but there is no zip64 end record")
	}
	if cdOffset+cdSize != cdEnd {
		return fail("the central directory (offset %d, %d bytes) does not end where the end record starts (offset %d)", cdOffset, cdSize, cdEnd)
	}
	d := directory{offset: cdOffset, size: cdSize, entries: entries}
	if err := countHeaders(r, d); err != nil {
		return fail("%v", err)
	}
	return d, nil
}

// zip64End reads the zip64 end record the locator loc (in front of the
// end record at endPos) points to, and checks it agrees with the end
// record's own values (or that those are saturated).
func zip64End(r io.ReaderAt, loc []byte, endPos, entries, cdSize, cdOffset int64) (directory, int64, error) {
	le := binary.LittleEndian
	if le.Uint32(loc[4:]) != 0 || le.Uint32(loc[16:]) != 1 {
		return directory{}, 0, errors.New("a multi-disk zip64 archive")
	}
	recPos := int64(le.Uint64(loc[8:]))
	if recPos < 0 || recPos > endPos-zip64LocLen-zip64EndLen {
		return directory{}, 0, fmt.Errorf("the zip64 locator points to offset %d, outside the archive", recPos)
	}
	var rec [zip64EndLen]byte
	if _, err := r.ReadAt(rec[:], recPos); err != nil {
		return directory{}, 0, fmt.Errorf("reading the zip64 end record: %w", err)
	}
	if le.Uint32(rec[:]) != sigEnd64 {
		return directory{}, 0, fmt.Errorf("no zip64 end record at offset %d", recPos)
	}
	// The record's size field counts what follows its first 12 bytes:
	// the locator must come right after it.
	if n := le.Uint64(rec[4:]); n > uint64(endPos) || recPos+12+int64(n) != endPos-zip64LocLen {
		return directory{}, 0, errors.New("data between the zip64 end record and its locator")
	}
	if le.Uint32(rec[16:]) != 0 || le.Uint32(rec[20:]) != 0 || le.Uint64(rec[24:]) != le.Uint64(rec[32:]) {
		return directory{}, 0, errors.New("a multi-disk zip64 archive")
	}
	d := directory{entries: int64(le.Uint64(rec[32:])), size: int64(le.Uint64(rec[40:])), offset: int64(le.Uint64(rec[48:]))}
	if d.entries < 0 || d.size < 0 || d.offset < 0 {
		return directory{}, 0, errors.New("zip64 end record values out of range")
	}
	agree := func(v32, v64, saturated int64) bool { return v32 == saturated || v32 == v64 }
	if !agree(entries, d.entries, 0xffff) || !agree(cdSize, d.size, 0xffffffff) || !agree(cdOffset, d.offset, 0xffffffff) {
		return directory{}, 0, fmt.Errorf("the end record (%d entries, %d bytes at %d) and the zip64 end record (%d entries, %d bytes at %d) disagree",
			entries, cdSize, cdOffset, d.entries, d.size, d.offset)
	}
	return d, recPos, nil
}

// countHeaders walks the central directory d header by header: it must
// hold exactly d.entries headers and nothing else.
func countHeaders(r io.ReaderAt, d directory) error {
	// Buffered: a torch wheel's directory holds thousands of headers,
	// and each would otherwise be a read of 46 bytes from the file.
	sr := bufio.NewReaderSize(io.NewSectionReader(r, d.offset, d.size), 64<<10)
	var hdr [centralHdrLen]byte
	var pos, n int64
	for pos < d.size {
		if _, err := io.ReadFull(sr, hdr[:]); err != nil {
			return fmt.Errorf("central directory header %d at offset %d: %w", n+1, d.offset+pos, err)
		}
		if binary.LittleEndian.Uint32(hdr[:]) != sigCentral {
			return fmt.Errorf("offset %d of the central directory holds no entry header", d.offset+pos)
		}
		le := binary.LittleEndian
		skip := int64(le.Uint16(hdr[28:])) + int64(le.Uint16(hdr[30:])) + int64(le.Uint16(hdr[32:]))
		if _, err := sr.Discard(int(skip)); err != nil && pos+centralHdrLen+skip <= d.size {
			return fmt.Errorf("central directory header %d at offset %d: %w", n+1, d.offset+pos, err)
		}
		pos += centralHdrLen + skip
		n++
	}
	if pos != d.size {
		return fmt.Errorf("the last central directory header runs %d bytes past the directory", pos-d.size)
	}
	if n != d.entries {
		return fmt.Errorf("the central directory holds %d entries, the end record says %d", n, d.entries)
	}
	return nil
}
