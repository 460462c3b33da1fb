// Package wheeltest writes valid (or deliberately broken) wheel files for
// tests and benchmarks, without Python. Real wheels built by pip are used
// by the end-to-end tests; these cover the cases pip will not produce.
package wheeltest

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// SpecYAML is a gpupass.yaml that pins the two packages the bundle tests
// build wheels for (alpha==1.0, beta-pkg==2.0); tests rewrite the pins and
// the Python version with strings.Replace.
const SpecYAML = `name: offline-job
runtime:
  cuda: 12.1.105
  nvidia-driver: 535.104.05
  python: 3.10.12
  pytorch: 2.1.2+cu121
  cuda-malloc-async: false
  packages:
    - alpha==1.0
    - beta-pkg==2.0
security:
  fips-compliant: false
  no-internet-access: false
resources:
  accelerator: h100-sxm5
  count: 1
  storage: {type: standard, size_gb: 100}
  network: {bandwidth_gbps: 25, latency_tolerance_ms: 100}
`

// File is one entry of a wheel. Data is read once, streamed into the zip.
type File struct {
	Name string
	Data io.Reader
}

// Options change what Write produces, to make broken wheels.
type Options struct {
	// Store writes entries uncompressed (fast for random content), sizes
	// and CRC in each local header, as Python's zipfile and pip write
	// them. Each entry is held in memory while it is written.
	Store bool
	// StoreDescriptor writes entries uncompressed with their sizes in a
	// data descriptor after the data, as Go's zip.Writer does; such a
	// wheel cannot be checked as a stream.
	StoreDescriptor bool
	// DeflateSized deflates entries and writes their sizes and CRC in
	// each local header, as Python's zipfile does for pip and
	// bdist_wheel: the form of most real wheels. Without it (and without
	// Store), entries are deflated with data descriptors, as Go's
	// zip.Writer writes them.
	DeflateSized bool
	// LieAbout makes RECORD carry a wrong hash for this entry name.
	LieAbout string
	// Unlisted leaves this entry name out of RECORD.
	Unlisted string
}

// Write writes a wheel named file under dir for dist and version, holding
// files plus METADATA, WHEEL and RECORD, and returns its path. The file
// name decides the tags; dist and version decide the .dist-info name.
func Write(dir, file, dist, version string, files []File, o Options) (string, error) {
	p := filepath.Join(dir, file)
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	method := zip.Deflate
	if o.Store || o.StoreDescriptor {
		method = zip.Store
	}
	distInfo := fmt.Sprintf("%s-%s.dist-info", strings.ReplaceAll(dist, "-", "_"), version)
	all := append([]File{}, files...)
	all = append(all,
		File{distInfo + "/METADATA", strings.NewReader(fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", dist, version))},
		File{distInfo + "/WHEEL", strings.NewReader("Wheel-Version: 1.0\nGenerator: gpupass-wheeltest\nRoot-Is-Purelib: true\nTag: py3-none-any\n")},
	)
	var record strings.Builder
	for _, e := range all {
		h := sha256.New()
		var n int64
		if o.Store || o.DeflateSized {
			b, err := io.ReadAll(e.Data)
			if err != nil {
				return "", err
			}
			raw, m := b, uint16(zip.Store)
			if o.DeflateSized {
				var c bytes.Buffer
				fw, _ := flate.NewWriter(&c, flate.DefaultCompression)
				fw.Write(b)
				fw.Close()
				raw, m = c.Bytes(), zip.Deflate
			}
			w, err := zw.CreateRaw(&zip.FileHeader{Name: e.Name, Method: m, CRC32: crc32.ChecksumIEEE(b),
				CompressedSize64: uint64(len(raw)), UncompressedSize64: uint64(len(b))})
			if err != nil {
				return "", err
			}
			if _, err := w.Write(raw); err != nil {
				return "", err
			}
			h.Write(b)
			n = int64(len(b))
		} else {
			w, err := zw.CreateHeader(&zip.FileHeader{Name: e.Name, Method: method})
			if err != nil {
				return "", err
			}
			if n, err = io.Copy(io.MultiWriter(w, h), e.Data); err != nil {
				return "", err
			}
		}
		sum := h.Sum(nil)
		if e.Name == o.LieAbout {
			sum[0] ^= 0xff
		}
		if e.Name != o.Unlisted {
			fmt.Fprintf(&record, "%s,sha256=%s,%d\n", e.Name, base64.RawURLEncoding.EncodeToString(sum), n)
		}
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", distInfo)
	w, err := zw.Create(distInfo + "/RECORD")
	if err != nil {
		return "", err
	}
	if _, err := io.WriteString(w, record.String()); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return p, f.Close()
}

// Simple writes a small valid pure-Python wheel name-version-py3-none-any.
func Simple(dir, dist, version string) (string, error) {
	file := fmt.Sprintf("%s-%s-py3-none-any.whl", strings.ReplaceAll(dist, "-", "_"), version)
	mod := strings.ReplaceAll(dist, "-", "_")
	return Write(dir, file, dist, version, []File{{mod + "/__init__.py", strings.NewReader("VERSION = '" + version + "'\n")}}, Options{})
}
