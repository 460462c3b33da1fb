package bundle_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

// BenchmarkPull pulls a wheelhouse of stored (random, incompressible)
// wheels from the real registry server: the profile of `bundle pull`
// without process start. GPUPASS_BENCH_WHEELS and GPUPASS_BENCH_MB size it
// (default 8×32 MB).
func BenchmarkPull(b *testing.B) {
	n, mb := envInt("GPUPASS_BENCH_WHEELS", 8), envInt("GPUPASS_BENCH_MB", 32)
	host := regtest.StartRegistry(b)
	house := b.TempDir()
	for i := range n {
		if err := storedWheel(house, fmt.Sprintf("benchpkg%02d", i), mb, byte(i)); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	ws, err := bundle.Scan(ctx, house, bundle.ScanOptions{Jobs: 2})
	if err != nil {
		b.Fatal(err)
	}
	o := bundle.RegistryOptions{PlainHTTP: true}
	res, err := bundle.Push(ctx, host+"/bench/pull:v1", ws, bundle.PushOptions{Registry: o})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(n) * int64(mb) << 20)
	out := b.TempDir()
	i := 0
	for b.Loop() {
		i++
		dir := filepath.Join(out, strconv.Itoa(i))
		if _, err := bundle.Pull(ctx, res.Reference, dir, bundle.PullOptions{Registry: o}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dir)
		b.StartTimer()
	}
}

// storedWheel writes a wheel the way Python's zipfile does for stored
// entries of known size (no data descriptors): one mb-MiB random blob.
// wheeltest streams entries, so its stored entries carry descriptors and
// take the random-access path; real wheels do not.
func storedWheel(dir, dist string, mb int, seed byte) error {
	blob := make([]byte, mb<<20)
	if _, err := rand.NewChaCha8([32]byte{seed}).Read(blob); err != nil {
		return err
	}
	di := dist + "-1.0.dist-info/"
	files := []struct {
		name string
		data []byte
	}{
		{dist + "/blob.bin", blob},
		{di + "METADATA", []byte("Metadata-Version: 2.1\nName: " + dist + "\nVersion: 1.0\n")},
		{di + "WHEEL", []byte("Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n")},
	}
	var record bytes.Buffer
	for _, f := range files {
		sum := sha256.Sum256(f.data)
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.data))
	}
	fmt.Fprintf(&record, "%sRECORD,,\n", di)
	files = append(files, struct {
		name string
		data []byte
	}{di + "RECORD", record.Bytes()})
	out, err := os.Create(filepath.Join(dir, dist+"-1.0-py3-none-any.whl"))
	if err != nil {
		return err
	}
	defer out.Close()
	zw := zip.NewWriter(out)
	for _, f := range files {
		w, err := zw.CreateRaw(&zip.FileHeader{Name: f.name, Method: zip.Store, CRC32: crc32.ChecksumIEEE(f.data),
			CompressedSize64: uint64(len(f.data)), UncompressedSize64: uint64(len(f.data))})
		if err != nil {
			return err
		}
		if _, err := w.Write(f.data); err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return out.Close()
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}
