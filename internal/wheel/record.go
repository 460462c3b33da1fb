package wheel

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/klauspost/compress/flate"
)

// Inspect opens the wheel at path and checks it against PEP 427: it is a
// readable zip, its entries have safe relative names, it holds a
// {name}-{version}.dist-info/RECORD, and every file the archive holds is
// listed in RECORD with the hash and size it really has. It reads the
// archive entry by entry and never holds a file whole in memory.
func Inspect(p string, f Filename) error {
	fh, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("wheel %s: %w", f.File, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return fmt.Errorf("wheel %s: %w", f.File, err)
	}
	return VerifyReader(fh, st.Size(), f)
}

// VerifyReader is Inspect for an archive already opened by the caller.
// The archive's end must be unambiguous (checkEnd) before its central
// directory is read.
func VerifyReader(r io.ReaderAt, size int64, f Filename) error {
	zr, err := openZip(r, size, f, -1)
	if err != nil {
		return err
	}
	return verify(zr, f)
}

type recordEntry struct {
	algo, digest string
	size         int64
	hasSize      bool
}

func verify(zr *zip.Reader, f Filename) error {
	// klauspost's inflater: 1.25 times the standard library's speed on
	// machine code (BenchmarkInflate), 1.36 on libtorch's.
	zr.RegisterDecompressor(zip.Deflate, func(r io.Reader) io.ReadCloser { return flate.NewReader(r) })
	files := map[string]*zip.File{}
	var record *zip.File
	for _, zf := range zr.File {
		name := zf.Name
		if err := checkName(zf, f); err != nil {
			return err
		}
		if _, dup := files[name]; dup {
			return fmt.Errorf("wheel %s: entry %q appears twice in the archive", f.File, name)
		}
		files[name] = zf
		if isRecordName(name, f) {
			if record != nil {
				return fmt.Errorf("wheel %s: more than one .dist-info/RECORD", f.File)
			}
			record = zf
		}
	}
	if record == nil {
		return fmt.Errorf("wheel %s: no %s-%s.dist-info/RECORD (not a valid wheel)", f.File, f.Distribution, f.Version)
	}
	b, err := readAll(record)
	if err != nil {
		return fmt.Errorf("wheel %s: %s: %w", f.File, record.Name, err)
	}
	entries, err := parseRecord(b)
	if err != nil {
		return fmt.Errorf("wheel %s: %s: %w", f.File, record.Name, err)
	}
	return checkRecord(f, files, record, entries, checkEntry)
}

// checkRecord checks that RECORD and the archive list the same files and
// that each file matches its hash, through check.
func checkRecord(f Filename, files map[string]*zip.File, record *zip.File, entries map[string]recordEntry, check func(*zip.File, recordEntry) error) error {
	for name, zf := range files {
		if strings.HasSuffix(name, "/") {
			continue
		}
		e, ok := entries[name]
		if !ok {
			// RECORD cannot hash itself; signatures of it are unhashed too.
			if name == record.Name || name == record.Name+".jws" || name == record.Name+".p7s" {
				continue
			}
			return fmt.Errorf("wheel %s: %s is in the archive but not listed in RECORD", f.File, name)
		}
		if name == record.Name {
			continue
		}
		if e.algo == "" {
			return fmt.Errorf("wheel %s: RECORD lists %s without a hash", f.File, name)
		}
		if err := check(zf, e); err != nil {
			return fmt.Errorf("wheel %s: %s: %w", f.File, name, err)
		}
	}
	for name := range entries {
		if _, ok := files[name]; !ok {
			return fmt.Errorf("wheel %s: RECORD lists %s, which the archive does not hold", f.File, name)
		}
	}
	return nil
}

// checkName refuses an entry name that would not land where it says
// (safeEntry) or that installers read otherwise (utf8Entry).
func checkName(zf *zip.File, f Filename) error {
	err := safeEntry(zf.Name)
	if err == nil {
		err = utf8Entry(zf)
	}
	if err != nil {
		return fmt.Errorf("wheel %s: %w", f.File, err)
	}
	return nil
}

func safeEntry(name string) error {
	switch {
	case name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, `\`) || strings.ContainsRune(name, 0):
		return fmt.Errorf("entry %q: not a safe relative path", name)
	case len(name) > 1 && name[1] == ':':
		return fmt.Errorf("entry %q: not a safe relative path", name)
	}
	for _, seg := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if seg == ".." || seg == "." || seg == "" {
			return fmt.Errorf("entry %q: not a safe relative path", name)
		}
	}
	return nil
}

// utf8Entry refuses a name with bytes beyond ASCII that the archive does
// not mark UTF-8: Python's zipfile (pip) reads such a name as cp437, so
// two entries that differ here ("é" in UTF-8, "\x82" in cp437) would be
// one file on disk, whichever comes last, each checked against its own
// RECORD line. Python's zipfile and Go's archive/zip mark every such name.
// (zip.File.NonUTF8 does not say this: Go also sets it for unmarked
// ASCII names with '~' or '\\', which Python's zipfile writes unmarked and
// reads the same either way.)
func utf8Entry(zf *zip.File) error {
	if zf.Flags&0x800 == 0 && !ascii(zf.Name) {
		return fmt.Errorf("entry %q: a name beyond ASCII that is not marked UTF-8 (installers would read it as cp437)", zf.Name)
	}
	return nil
}

func ascii(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func readAll(zf *zip.File) ([]byte, error) {
	if zf.UncompressedSize64 > 64<<20 {
		return nil, errors.New("RECORD larger than 64 MiB")
	}
	rc, err := zf.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, 64<<20))
}

func parseRecord(b []byte) (map[string]recordEntry, error) {
	r := csv.NewReader(bytes.NewReader(b))
	r.FieldsPerRecord = -1
	out := map[string]recordEntry{}
	for line := 1; ; line++ {
		row, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(row) == 1 && row[0] == "" {
			continue
		}
		if len(row) != 3 {
			return nil, fmt.Errorf("line %d: want path,hash,size, got %d fields", line, len(row))
		}
		var e recordEntry
		if row[1] != "" {
			algo, digest, ok := strings.Cut(row[1], "=")
			if !ok {
				return nil, fmt.Errorf("line %d: hash %q: want algorithm=urlsafe-base64", line, row[1])
			}
			e.algo, e.digest = algo, digest
		}
		if row[2] != "" {
			n, err := strconv.ParseInt(row[2], 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("line %d: size %q is not a number", line, row[2])
			}
			e.size, e.hasSize = n, true
		}
		if _, dup := out[row[0]]; dup {
			return nil, fmt.Errorf("line %d: %s listed twice", line, row[0])
		}
		out[row[0]] = e
	}
	return out, nil
}

func checkEntry(zf *zip.File, e recordEntry) error {
	var h hash.Hash
	switch e.algo {
	case "sha256":
		h = sha256.New()
	case "sha384", "sha512":
		return checkEntryLong(zf, e)
	default:
		// PEP 427 forbids md5 and sha1; anything unknown cannot be checked.
		return fmt.Errorf("RECORD hash algorithm %q is not accepted (want sha256, sha384 or sha512)", e.algo)
	}
	return hashEntry(zf, e, h)
}

func hashEntry(zf *zip.File, e recordEntry, h hash.Hash) error {
	rc, err := zf.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	// zip's reader checks the CRC at EOF, so a corrupt archive fails here.
	n, err := io.Copy(h, rc)
	if err != nil {
		return fmt.Errorf("reading: %w", err)
	}
	got := base64.RawURLEncoding.EncodeToString(h.Sum(nil))
	if got != trimPad(e.digest) {
		return fmt.Errorf("RECORD says %s=%s but the file hashes to %s=%s", e.algo, e.digest, e.algo, got)
	}
	if e.hasSize && n != e.size {
		return fmt.Errorf("RECORD says %d bytes but the file has %d", e.size, n)
	}
	return nil
}

func trimPad(s string) string { return strings.TrimRight(s, "=") }

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+len(sep):], true
}

func cutSuffix(s, suffix string) (string, bool) { return strings.CutSuffix(s, suffix) }
