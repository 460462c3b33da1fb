package wheel_test

import (
	"bufio"
	"bytes"
	stdflate "compress/flate"
	"crypto/sha256"
	"io"
	"os"
	"testing"

	"github.com/klauspost/compress/flate"

	"github.com/gpupass/gpupass/internal/wheel"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// machineCode is up to 8 MiB of this test binary: compiled code and data
// compress about as well as the shared libraries that make up most of a
// CUDA or PyTorch wheel (2-3x), unlike random bytes.
func machineCode(b *testing.B) []byte {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		b.Fatal(err)
	}
	return data[:min(len(data), 8<<20)]
}

// BenchmarkInflate compares the standard library's inflater with
// klauspost's, which wheel verification uses, on machine code deflated
// at zlib's default level (as Python's zipfile writes wheels).
func BenchmarkInflate(b *testing.B) {
	data := machineCode(b)
	var c bytes.Buffer
	w, _ := stdflate.NewWriter(&c, stdflate.DefaultCompression)
	w.Write(data)
	w.Close()
	for _, tc := range []struct {
		name string
		open func(io.Reader) io.ReadCloser
	}{
		{"stdlib", stdflate.NewReader},
		{"klauspost", flate.NewReader},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				r := tc.open(bufio.NewReaderSize(bytes.NewReader(c.Bytes()), 64<<10))
				if n, err := io.Copy(io.Discard, r); err != nil || n != int64(len(data)) {
					b.Fatal(n, err)
				}
			}
		})
	}
}

// BenchmarkVerifyStreamDeflated is a push's (or a RECORD-checking
// pull's) verification of a deflated wheel (Python's form, sizes in the
// local headers): the compressed stream hashed for the digest and every
// entry inflated and hashed in the same pass, then (Check) the central
// directory. Throughput is of uncompressed bytes.
func BenchmarkVerifyStreamDeflated(b *testing.B) {
	data := machineCode(b)
	fn, _ := wheel.ParseFilename("demo-1.0-py3-none-any.whl")
	var files []wheeltest.File
	for i := range 4 {
		files = append(files, wheeltest.File{Name: "demo/lib" + string(rune('a'+i)) + ".so", Data: bytes.NewReader(data[i*len(data)/4 : (i+1)*len(data)/4])})
	}
	p, err := wheeltest.Write(b.TempDir(), fn.File, "demo", "1.0", files, wheeltest.Options{DeflateSized: true})
	if err != nil {
		b.Fatal(err)
	}
	whl, _ := os.ReadFile(p)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		s, _, err := wheel.VerifyStreamHash(bytes.NewReader(whl), fn, sha256.New())
		if err == nil {
			err = s.Check(bytes.NewReader(whl), int64(len(whl)))
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
