package wheel_test

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/gpupass/gpupass/internal/wheel"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// chunkReader returns at most a random number of bytes per Read, as a
// network connection does.
type chunkReader struct {
	r   io.Reader
	rnd *rand.Rand
	max int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	n := 1 + c.rnd.IntN(c.max)
	return c.r.Read(p[:min(len(p), n)])
}

// textBytes is n bytes of words picked at random: they compress.
func textBytes(r *rand.Rand, n int) []byte {
	words := []string{"tensor ", "kernel ", "cuda ", "float32 ", "grad\n", "0x7f3a ", "libtorch_cpu.so "}
	var b []byte
	for len(b) < n {
		b = append(b, words[r.IntN(len(words))]...)
	}
	return b[:n]
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestVerifyStreamHash checks that the whole-stream hash is the SHA-256
// of exactly the bytes given, for stored, stored-with-descriptor,
// deflated-with-descriptor and deflated-with-sizes (Python's) wheels, entries of sizes around block and buffer edges, reads
// cut at random points or one byte at a time; and that the entry hashes
// taken in the same pass still satisfy RECORD.
func TestVerifyStreamHash(t *testing.T) {
	rnd := rand.New(rand.NewPCG(9, 10))
	fn, err := wheel.ParseFilename("demo-1.0-py3-none-any.whl")
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{0, 1, 63, 64, 65, 300, 4095, 256<<10 - 1, 256 << 10, 256<<10 + 1, 1<<20 + 13}
	var files []wheeltest.File
	for i, n := range sizes {
		files = append(files, wheeltest.File{Name: "demo/f" + string(rune('a'+i)), Data: bytes.NewReader(randomBytes(rnd, n))})
	}
	// Compressible entries, so that deflate writes Huffman blocks and
	// inflating them reads the compressed bytes in irregular amounts.
	for i, n := range []int{10, 5000, 700 << 10} {
		files = append(files, wheeltest.File{Name: "demo/t" + string(rune('a'+i)), Data: bytes.NewReader(textBytes(rnd, n))})
	}
	var wheels []string
	for _, o := range []wheeltest.Options{{Store: true}, {StoreDescriptor: true}, {}, {DeflateSized: true}} {
		for i := range files {
			files[i].Data.(*bytes.Reader).Seek(0, io.SeekStart)
		}
		sub := t.TempDir()
		p, err := wheeltest.Write(sub, fn.File, "demo", "1.0", files, o)
		if err != nil {
			t.Fatal(err)
		}
		wheels = append(wheels, p)
	}
	for wi, p := range wheels {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		want := sha256.Sum256(b)
		for ri, r := range []io.Reader{
			bytes.NewReader(b),
			&chunkReader{bytes.NewReader(b), rnd, 100000},
			&chunkReader{bytes.NewReader(b), rnd, 70},
			iotest.OneByteReader(bytes.NewReader(b)),
		} {
			h := sha256.New()
			s, n, err := wheel.VerifyStreamHash(r, fn, h)
			if got := h.Sum(nil); !bytes.Equal(got, want[:]) || n != int64(len(b)) {
				t.Fatalf("wheel %d reader %d: %d bytes hashed to %x, want %d bytes, %x", wi, ri, n, got, len(b), want)
			}
			if wi == 1 {
				if !errors.Is(err, wheel.ErrNotStreamable) {
					t.Fatalf("stored entries with data descriptors: %v, want ErrNotStreamable", err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("wheel %d reader %d: %v", wi, ri, err)
			}
			if err := s.Check(bytes.NewReader(b), int64(len(b))); err != nil {
				t.Fatalf("wheel %d reader %d: Check: %v", wi, ri, err)
			}
		}
	}
}

// A stored entry whose RECORD hash lies is caught by the paired hash, and
// a wheel cut off in the middle of a stored entry still hashes exactly
// the bytes that came.
func TestVerifyStreamHashStoredFaults(t *testing.T) {
	rnd := rand.New(rand.NewPCG(11, 12))
	fn, _ := wheel.ParseFilename("demo-1.0-py3-none-any.whl")
	data := randomBytes(rnd, 700<<10)
	p, err := wheeltest.Write(t.TempDir(), fn.File, "demo", "1.0",
		[]wheeltest.File{{Name: "demo/blob.bin", Data: bytes.NewReader(data)}}, wheeltest.Options{Store: true, LieAbout: "demo/blob.bin"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	s, _, err := wheel.VerifyStreamHash(bytes.NewReader(b), fn, sha256.New())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(bytes.NewReader(b), int64(len(b))); err == nil || !strings.Contains(err.Error(), "demo/blob.bin") || !strings.Contains(err.Error(), "RECORD says sha256=") {
		t.Fatalf("lying RECORD: %v", err)
	}

	cut := b[:len(b)/2]
	for _, r := range []io.Reader{bytes.NewReader(cut), &chunkReader{bytes.NewReader(cut), rnd, 1 << 16}} {
		h := sha256.New()
		_, n, err := wheel.VerifyStreamHash(r, fn, h)
		if err == nil || !strings.Contains(err.Error(), "demo/blob.bin") {
			t.Fatalf("cut-off wheel: %v, want an error naming the entry", err)
		}
		if want := sha256.Sum256(cut); n != int64(len(cut)) || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("cut-off wheel: hashed %d bytes to %x, want %d bytes", n, h.Sum(nil), len(cut))
		}
	}
	// A source that fails in the middle of a stored entry: its error is
	// the one reported, as a ReadError.
	boom := errors.New("connection reset by registry")
	_, _, err = wheel.VerifyStreamHash(&failingReader{chunkReader{bytes.NewReader(cut), rnd, 1 << 16}, boom}, fn, sha256.New())
	var re *wheel.ReadError
	if !errors.As(err, &re) || !errors.Is(err, boom) {
		t.Fatalf("source failing mid-entry: %v, want a ReadError wrapping %v", err, boom)
	}
}

// failingReader ends with err instead of io.EOF.
type failingReader struct {
	chunkReader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.chunkReader.Read(p)
	if err == io.EOF {
		err = f.err
	}
	return n, err
}

// Deflated entries with their sizes in the local header (Python's form)
// are read ahead in bulk: a lying RECORD, a corrupt deflate stream and a
// wheel cut off inside one must still be caught, and the stream hash must
// still cover exactly the bytes that came.
func TestVerifyStreamHashDeflatedFaults(t *testing.T) {
	rnd := rand.New(rand.NewPCG(13, 14))
	fn, _ := wheel.ParseFilename("demo-1.0-py3-none-any.whl")
	text := textBytes(rnd, 900<<10)
	write := func(o wheeltest.Options) []byte {
		o.DeflateSized = true
		p, err := wheeltest.Write(t.TempDir(), fn.File, "demo", "1.0",
			[]wheeltest.File{{Name: "demo/a.txt", Data: bytes.NewReader(text)}, {Name: "demo/b.txt", Data: strings.NewReader("small")}}, o)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		return b
	}

	b := write(wheeltest.Options{LieAbout: "demo/a.txt"})
	s, _, err := wheel.VerifyStreamHash(bytes.NewReader(b), fn, sha256.New())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(bytes.NewReader(b), int64(len(b))); err == nil || !strings.Contains(err.Error(), "demo/a.txt") || !strings.Contains(err.Error(), "RECORD says sha256=") {
		t.Fatalf("lying RECORD: %v", err)
	}

	good := write(wheeltest.Options{})
	// The first entry's data starts after its 30-byte header and name.
	start := 30 + len("demo/a.txt")
	corrupt := append([]byte(nil), good...)
	for i := start + 1000; i < start+1100; i++ {
		corrupt[i] ^= 0x5a
	}
	cut := good[:start+len(good)/4]
	// The entry's bytes are sound but its CRC, the same in the local
	// header and in the central directory, is not: pip would refuse it.
	badCRC := append([]byte(nil), good...)
	badCRC[14] ^= 1
	for i := 0; i+46+len("demo/a.txt") <= len(badCRC); i++ {
		if string(badCRC[i:i+4]) == "PK\x01\x02" && string(badCRC[i+46:i+46+len("demo/a.txt")]) == "demo/a.txt" {
			badCRC[i+16] ^= 1
		}
	}
	for name, bad := range map[string][]byte{"corrupt": corrupt, "cut off": cut, "bad CRC": badCRC} {
		for ri, r := range []io.Reader{bytes.NewReader(bad), &chunkReader{bytes.NewReader(bad), rnd, 1 << 12}} {
			h := sha256.New()
			s, n, err := wheel.VerifyStreamHash(r, fn, h)
			if err == nil {
				err = s.Check(bytes.NewReader(bad), int64(len(bad)))
			}
			if err == nil || !strings.Contains(err.Error(), "demo/a.txt") {
				t.Fatalf("%s wheel, reader %d: %v, want an error naming the entry", name, ri, err)
			}
			if want := sha256.Sum256(bad); n != int64(len(bad)) || !bytes.Equal(h.Sum(nil), want[:]) {
				t.Fatalf("%s wheel, reader %d: hashed %d bytes to %x, want %d bytes", name, ri, n, h.Sum(nil), len(bad))
			}
		}
	}
}

// An entry that inflates to far more than its header says (a deflate
// bomb, or just a lie) is refused after the header's size, not inflated
// to its end: here 1 GiB of zeros behind a header that says 1000 bytes.
func TestStreamStopsAtTheDeclaredSize(t *testing.T) {
	fn, _ := wheel.ParseFilename("demo-1.0-py3-none-any.whl")
	var c bytes.Buffer
	fw, _ := flate.NewWriter(&c, flate.BestCompression)
	zeros := make([]byte, 1<<20)
	for range 1 << 10 {
		fw.Write(zeros)
	}
	fw.Close()
	// The header says 1000 bytes, in the local header and the central
	// directory alike, so that only inflating can tell.
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	w, err := zw.CreateRaw(&zip.FileHeader{Name: "demo/zeros.bin", Method: zip.Deflate,
		CompressedSize64: uint64(c.Len()), UncompressedSize64: 1000})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(c.Bytes())
	rec, _ := zw.Create("demo-1.0.dist-info/RECORD")
	io.WriteString(rec, "demo/zeros.bin,sha256=AAAA,1000\ndemo-1.0.dist-info/RECORD,,\n")
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	whl := b.Bytes()
	h := sha256.New()
	_, n, err := wheel.VerifyStreamHash(bytes.NewReader(whl), fn, h)
	if err == nil || !strings.Contains(err.Error(), "demo/zeros.bin: corrupt entry") {
		t.Fatalf("entry larger than its header: %v", err)
	}
	// Refused, and the stream still read (and hashed) to its end.
	if want := sha256.Sum256(whl); n != int64(len(whl)) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("hashed %d bytes, want all %d", n, len(whl))
	}
}
