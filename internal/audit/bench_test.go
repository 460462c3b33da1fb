package audit

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// benchRun is the fixture run with n metric points over four series,
// the shape of a long training run's log.
func benchRun(b *testing.B, f *fixture, n int) *Run {
	b.Helper()
	r := f.run(b)
	r.Metrics = make([]MetricPoint, 0, n)
	names := []string{"loss", "lr", "grad_norm", "tokens_per_s"}
	for i := range n {
		step := int64(i / len(names))
		r.Metrics = append(r.Metrics, MetricPoint{
			Name: names[i%len(names)], Step: step,
			Value: 1 / float64(step+1), Time: r.StartedAt.Add(time.Duration(step) * time.Second),
		})
	}
	return r
}

// BenchmarkAudit measures building, signing and verifying the report of
// a run with 100,000 metric points (make bench reports it).
func BenchmarkAudit(b *testing.B) {
	f := loadFixture(b)
	r := benchRun(b, f, 100_000)
	ctx := context.Background()
	rep, err := Build(ctx, r, BuildOptions{Signer: f.signer, Version: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("build+sign/100k-points", func(b *testing.B) {
		for b.Loop() {
			if _, err := Build(ctx, r, BuildOptions{Signer: f.signer, Version: "bench"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify/100k-points", func(b *testing.B) {
		for b.Loop() {
			if res := Verify(ctx, rep.Zip, VerifyOptions{Key: f.cosignPub}); !res.OK {
				b.Fatal(fmt.Sprint(res.Layers))
			}
		}
	})
	b.Run("build+sign+verify/100k-points", func(b *testing.B) {
		for b.Loop() {
			rep, err := Build(ctx, r, BuildOptions{Signer: f.signer, Version: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			if res := Verify(ctx, rep.Zip, VerifyOptions{Key: f.cosignPub}); !res.OK {
				b.Fatal(fmt.Sprint(res.Layers))
			}
		}
	})
}

// BenchmarkSignManifest measures signing the manifest alone, in process
// (the key already decrypted).
func BenchmarkSignManifest(b *testing.B) {
	f := loadFixture(b)
	rep := f.build(b, f.run(b), false)
	mb := getFrom(b, entries(b, rep.Zip), FileManifest)
	for b.Loop() {
		if _, err := f.signer.SignBlob(context.Background(), mb); err != nil {
			b.Fatal(err)
		}
	}
}
