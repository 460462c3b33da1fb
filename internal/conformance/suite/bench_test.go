package suite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/internal/probe"
)

// benchSuite is the agent's suite on a simulated profile with the
// agent's default 64 MiB read probe on a temp dir.
func benchSuite(b *testing.B, profile string) *Suite {
	p, err := probe.LoadProfile(profile)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	return New(p.GPUProbe(), p.NVCCProbe(), p.PythonProbe(nil), probe.Storage{Path: dir},
		probe.ReadThroughput{Path: dir, Bytes: 64 << 20}, probe.FIPS{Path: filepath.Join(dir, "fips")})
}

// BenchmarkSuiteCold: every probe measured (first run after start).
func BenchmarkSuiteCold(b *testing.B) {
	ctx := context.Background()
	exp := Expectations{StorageClass: "standard"}
	for b.Loop() {
		s := benchSuite(b, "h100-sxm5-8x")
		if _, err := s.Run(ctx, exp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSuiteWarm: a timer run where nothing keyed changed, so the
// read probe is reused and only live probes run.
func BenchmarkSuiteWarm(b *testing.B) {
	ctx := context.Background()
	exp := Expectations{StorageClass: "standard"}
	s := benchSuite(b, "h100-sxm5-8x")
	if _, err := s.Run(ctx, exp); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.Run(ctx, exp); err != nil {
			b.Fatal(err)
		}
	}
}
