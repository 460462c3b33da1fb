package wheel_test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/wheel"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

const demoWheel = "demo-1.0-py3-none-any.whl"

// demoBytes is a wheel whose demo/__init__.py holds code, in Python's
// layout (stored, sizes in the local headers).
func demoBytes(t *testing.T, code string) []byte {
	t.Helper()
	p, err := wheeltest.Write(t.TempDir(), demoWheel, "demo", "1.0",
		[]wheeltest.File{{Name: "demo/__init__.py", Data: strings.NewReader(code)}}, wheeltest.Options{Store: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// split cuts a zip without comment into its local entries, its central
// directory and the directory's entry count.
func split(b []byte) (local, dir []byte, n uint16) {
	le := binary.LittleEndian
	end := b[len(b)-22:]
	off, size := le.Uint32(end[16:]), le.Uint32(end[12:])
	return b[:off], b[off : off+size], le.Uint16(end[10:])
}

// endRecord is an end of central directory record.
func endRecord(entries uint16, size, offset uint32) []byte {
	le := binary.LittleEndian
	e := make([]byte, 22)
	le.PutUint32(e, 0x06054b50)
	le.PutUint16(e[8:], entries)
	le.PutUint16(e[10:], entries)
	le.PutUint32(e[12:], size)
	le.PutUint32(e[16:], offset)
	return e
}

// zip64End is a zip64 end record at pos and its locator.
func zip64End(pos int, entries, size, offset uint64) []byte {
	le := binary.LittleEndian
	r := make([]byte, 56+20)
	le.PutUint32(r, 0x06064b50)
	le.PutUint64(r[4:], 44)
	le.PutUint16(r[12:], 45)
	le.PutUint16(r[14:], 45)
	le.PutUint64(r[24:], entries)
	le.PutUint64(r[32:], entries)
	le.PutUint64(r[40:], size)
	le.PutUint64(r[48:], offset)
	le.PutUint32(r[56:], 0x07064b50)
	le.PutUint64(r[56+8:], uint64(pos))
	le.PutUint32(r[56+16:], 1)
	return r
}

// moveOffsets adds delta to every local header offset in a directory.
func moveOffsets(dir []byte, n uint16, delta int) []byte {
	le := binary.LittleEndian
	dir = append([]byte(nil), dir...)
	for i, k := 0, 0; k < int(n); k++ {
		le.PutUint32(dir[i+42:], uint32(int(le.Uint32(dir[i+42:]))+delta))
		i += 46 + int(le.Uint16(dir[i+28:])) + int(le.Uint16(dir[i+30:])) + int(le.Uint16(dir[i+32:]))
	}
	return dir
}

// hidden builds wheels with a second central directory behind the one
// gpupass would check, listing entries pip would install instead.
func hidden(t *testing.T) map[string][]byte {
	// The checked entries are longer than the hidden ones, so that the
	// offsets Python shifts stay positive.
	good := demoBytes(t, "X = 1\n#"+strings.Repeat("#", 4096))
	evil := demoBytes(t, "import os; os.system('echo PWNED')\n")
	l, dirA, nA := split(good)
	h, dirB, nB := split(evil)
	o, p := len(l), len(l)+len(dirA)
	out := map[string][]byte{}

	// Python shifts every offset by the end record's position minus the
	// directory's size and offset; Go reads directory A at its offset.
	concat := p + len(h) - o
	dirB1 := moveOffsets(dirB, nB, p-concat)
	out["prepended-data offset"] = bytes.Join([][]byte{l, dirA, h, dirB1, endRecord(nA, uint32(len(dirB1)), uint32(o))}, nil)

	// Python honours a zip64 end record in front of the end record even
	// when nothing needs it; Go does not.
	dirB2 := moveOffsets(dirB, nB, p)
	rec := p + len(h) + len(dirB2)
	out["unneeded zip64 record"] = bytes.Join([][]byte{l, dirA, h, dirB2,
		zip64End(rec, uint64(nB), uint64(len(dirB2)), uint64(p+len(h))), endRecord(nA, uint32(len(dirA)), uint32(o))}, nil)
	return out
}

// TestHiddenCentralDirectoryRefused: a wheel whose end lets Python's
// zipfile (pip) read another central directory than Go's archive/zip is
// refused by every check, before any of its files is trusted.
func TestHiddenCentralDirectoryRefused(t *testing.T) {
	t.Parallel()
	fn, err := wheel.ParseFilename(demoWheel)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range hidden(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// The wheel is a real attack: Python reads the hidden file.
			p := filepath.Join(t.TempDir(), demoWheel)
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(testutil.Tool(t, "python3"), "-c", "import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).read('demo/__init__.py'))", p).CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("PWNED")) {
				t.Fatalf("python's zipfile does not read the hidden entry, so this is no test: %s %v", out, err)
			}
			s, err := wheel.VerifyStream(bytes.NewReader(b), fn)
			if err == nil {
				err = s.Check(bytes.NewReader(b), int64(len(b)))
			}
			if err == nil || !strings.Contains(err.Error(), "ambiguous zip archive") {
				t.Errorf("stream check: %v, want an ambiguous zip archive", err)
			}
			if err := wheel.VerifyReader(bytes.NewReader(b), int64(len(b)), fn); err == nil || !strings.Contains(err.Error(), "ambiguous zip archive") {
				t.Errorf("VerifyReader: %v, want an ambiguous zip archive", err)
			}
			if err := wheel.Inspect(p, fn); err == nil {
				t.Error("Inspect accepted it")
			}
		})
	}
}

// TestArchiveEnds: zip64 end records as writers make them (agreeing, or
// carrying the values the end record saturates) pass; trailing bytes, a
// comment that does not reach the end, a directory that does not end at
// the end record and a wrong entry count are refused.
func TestArchiveEnds(t *testing.T) {
	t.Parallel()
	fn, err := wheel.ParseFilename(demoWheel)
	if err != nil {
		t.Fatal(err)
	}
	good := demoBytes(t, "X = 1\n")
	l, dir, n := split(good)
	o, rec := len(l), len(l)+len(dir)
	withComment := append(append([]byte(nil), good...), "built by hand"...)
	binary.LittleEndian.PutUint16(withComment[len(good)-2:], uint16(len("built by hand")))
	tests := []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"as written", good, true},
		{"a comment to the end", withComment, true},
		{"zip64 record agreeing with the end record", bytes.Join([][]byte{l, dir, zip64End(rec, uint64(n), uint64(len(dir)), uint64(o)), endRecord(n, uint32(len(dir)), uint32(o))}, nil), true},
		{"zip64 record for a saturated end record", bytes.Join([][]byte{l, dir, zip64End(rec, uint64(n), uint64(len(dir)), uint64(o)), endRecord(0xffff, 0xffffffff, 0xffffffff)}, nil), true},
		{"bytes after the end record", append(append([]byte(nil), good...), "junk"...), false},
		{"zip64 record disagreeing", bytes.Join([][]byte{l, dir, zip64End(rec, uint64(n), uint64(len(dir)), uint64(o)), endRecord(n, uint32(len(dir)), uint32(o+1))}, nil), false},
		{"saturated without zip64", bytes.Join([][]byte{l, dir, endRecord(0xffff, 0xffffffff, 0xffffffff)}, nil), false},
		{"a gap before the end record", bytes.Join([][]byte{l, dir, []byte("gap!"), endRecord(n, uint32(len(dir)), uint32(o))}, nil), false},
		{"one entry fewer than the directory holds", bytes.Join([][]byte{l, dir, endRecord(n-1, uint32(len(dir)), uint32(o))}, nil), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			errR := wheel.VerifyReader(bytes.NewReader(tc.b), int64(len(tc.b)), fn)
			s, errS := wheel.VerifyStream(bytes.NewReader(tc.b), fn)
			if errS == nil {
				errS = s.Check(bytes.NewReader(tc.b), int64(len(tc.b)))
			}
			if tc.ok && (errR != nil || errS != nil) {
				t.Errorf("refused: %v / %v", errR, errS)
			}
			if !tc.ok && (errR == nil || errS == nil) {
				t.Errorf("accepted: VerifyReader %v, stream %v", errR, errS)
			}
		})
	}
}

// TestNamesNotMarkedUTF8Refused: an entry whose name goes beyond ASCII
// without the UTF-8 flag is refused (pip would read it as cp437, so it
// could land on another entry's path); the same name marked UTF-8, as
// every writer marks it, passes.
func TestNamesNotMarkedUTF8Refused(t *testing.T) {
	t.Parallel()
	fn, err := wheel.ParseFilename(demoWheel)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		marked  bool
		refused bool
	}{
		{"demo/é.py", true, false},
		{"demo/é.py", false, true},
		// ASCII with '~', as Python's zipfile writes it (no UTF-8 flag):
		// Go's reader calls it NonUTF8, installers read it the same.
		{"demo/a~b.py", false, false},
	} {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		var record strings.Builder
		for _, e := range []struct{ name, body string }{
			{"demo/__init__.py", "X = 1\n"}, {tc.name, "Y = 2\n"},
			{"demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"},
			{"demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		} {
			w, err := zw.CreateHeader(&zip.FileHeader{Name: e.name, Method: zip.Deflate, NonUTF8: !tc.marked && e.name == tc.name})
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(w, e.body)
			sum := sha256.Sum256([]byte(e.body))
			fmt.Fprintf(&record, "%s,sha256=%s,%d\n", e.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(e.body))
		}
		record.WriteString("demo-1.0.dist-info/RECORD,,\n")
		w, _ := zw.Create("demo-1.0.dist-info/RECORD")
		io.WriteString(w, record.String())
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		b := buf.Bytes()
		errR := wheel.VerifyReader(bytes.NewReader(b), int64(len(b)), fn)
		s, errS := wheel.VerifyStream(bytes.NewReader(b), fn)
		if errS == nil {
			errS = s.Check(bytes.NewReader(b), int64(len(b)))
		}
		switch {
		case !tc.refused && (errR != nil || errS != nil):
			t.Errorf("%q (marked UTF-8: %v) refused: %v / %v", tc.name, tc.marked, errR, errS)
		case tc.refused && (errR == nil || errS == nil || !strings.Contains(errR.Error(), "cp437") || !strings.Contains(errS.Error(), "cp437")):
			t.Errorf("%q unmarked: %v / %v, want both refused", tc.name, errR, errS)
		}
	}
}
