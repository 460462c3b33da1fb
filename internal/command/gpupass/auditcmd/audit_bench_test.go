package auditcmd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/testutil"
)

// BenchmarkAuditFromBroker measures the whole audit of a finished run
// with 100,000 metric points (25,000 steps × 4 series) as `gpupass audit`
// does it, minus the key decryption: GetRunEvidence + GetMetrics from a
// real broker on SQLite, build, sign, then verify every layer.
func BenchmarkAuditFromBroker(b *testing.B) {
	ctx := context.Background()
	cfg := brokertest.Fast()
	// The run's 100k points go up in a few batches at once; the broker's
	// records-per-second limit (5,000 by default) would refuse them.
	cfg.RunMaxRecordsPerSecond = -1
	br := brokertest.Start(b, brokertest.NewDB(b, "sqlite"), cfg)
	l := brokertest.StartRun(b, br, "us-west-2")
	run := l.Run
	const steps = 25_000
	for from := 1; from <= steps; from += 5000 {
		var recs []*gpupassv1.Record
		for s := from; s < from+5000; s++ {
			recs = append(recs, brokertest.MetricRecord(uint64(s), s, fmt.Sprintf(`"loss":%g,"lr":0.001,"grad_norm":%g,"tokens_per_s":41000`, 1/float64(s), 2/float64(s))))
		}
		if _, err := l.Upload(recs...); err != nil {
			b.Fatal(err)
		}
	}
	l.Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, steps)

	kb, err := os.ReadFile(filepath.Join(testutil.RepoRoot(b), "internal", "audit", "testdata", "cosign.key"))
	if err != nil {
		b.Fatal(err)
	}
	key, err := audit.LoadPrivateKey(audit.KeyRef("env://K"), []byte("gpupass-test"), func(string) string { return string(kb) }, nil)
	if err != nil {
		b.Fatal(err)
	}
	signer, err := audit.NewKeySigner(key, "")
	if err != nil {
		b.Fatal(err)
	}
	pub, _, err := audit.LoadPublicKey(audit.KeyRef(filepath.Join(testutil.RepoRoot(b), "internal", "audit", "testdata", "cosign.pub")), os.Getenv)
	if err != nil {
		b.Fatal(err)
	}
	src := &BrokerRuns{Broker: &gpupass.BrokerFlags{URL: br.URL, Token: br.Token(b, store.RoleRead, "us-west-2")}}
	for b.Loop() {
		r, err := src.Run(ctx, run.Id)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Metrics) != 4*steps {
			b.Fatalf("%d metric points, want %d", len(r.Metrics), 4*steps)
		}
		out, err := audit.Build(ctx, r, audit.BuildOptions{Signer: signer, Version: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		if res := audit.Verify(ctx, out.Zip, audit.VerifyOptions{Key: pub, Fingerprint: declaredFingerprint}); !res.OK {
			b.Fatalf("verify failed at %s: %+v", res.FailedLayer, res.Layers)
		}
	}
}
