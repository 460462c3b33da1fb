package auditcmd_test

import (
	"archive/zip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/sigstoretest"
)

// BenchmarkKeylessVsCosign (make bench, issue #37) times keyless signing
// and verifying of one audit report, as processes on the private Sigstore
// (Fulcio, Rekor v2, timestamp authority), against its peer measured in
// the same run on the same services and the same manifest: `gpupass audit
// --identity-token` (build the zip, certificate, log entry, signed
// timestamp) + `gpupass audit verify` by identity, beside `cosign
// sign-blob` + `cosign verify-blob` keyless of that report's
// manifest.json. Each pair runs KEYLESS_BENCH_RUNS times (default 15),
// alternating; it reports p50 and p95 in ms of each. One b.N: run it with
// -benchtime 1x.
func BenchmarkKeylessVsCosign(b *testing.B) {
	n := 15
	if v := os.Getenv("KEYLESS_BENCH_RUNS"); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil || n < 2 {
			b.Fatalf("KEYLESS_BENCH_RUNS=%q: want a count of 2 or more", v)
		}
	}
	cosign := testutil.Tool(b, "cosign")
	gp := testutil.BuildBinary(b, "./cmd/gpupass")
	sig := sigstoretest.Start(b)
	gl := sigstoretest.GitLabClaims{ProjectPath: "ml-team/llm", Ref: "main", SHA: strings.Repeat("deadbeef", 5)}
	id, iss := gl.Identity(), sig.Issuer(gl)
	dir := b.TempDir()
	root := testutil.RepoRoot(b)
	run := filepath.Join(root, "internal", "audit", "testdata", "run.json")
	home := b.TempDir()
	env := append(os.Environ(), "HOME="+home, "TUF_ROOT="+filepath.Join(home, "tuf"), "SIGSTORE_NO_CACHE=true",
		"GITHUB_ACTIONS=", "GITLAB_CI=", "SIGSTORE_ID_TOKEN=", "ACTIONS_ID_TOKEN_REQUEST_URL=", "COSIGN_YES=true")
	exe := func(name string, args ...string) time.Duration {
		b.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		took := time.Since(t0)
		if err != nil {
			b.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
		}
		return took
	}
	var gpSign, gpVerify, coSign, coVerify []time.Duration
	for b.Loop() {
		for i := range n {
			// A fresh token per pair (each lives ten minutes), in a
			// file: what both take.
			tok := filepath.Join(dir, "token")
			if err := os.WriteFile(tok, []byte(sig.Token(b, gl)), 0o600); err != nil {
				b.Fatal(err)
			}
			gpSign = append(gpSign, exe(gp, "audit", "alloc-7f3a", "--run-file", run, "--out", "a.zip", "--identity-token", tok,
				"--signing-config", sig.SigningConfig, "--trusted-root", sig.TrustedRoot))
			gpVerify = append(gpVerify, exe(gp, "audit", "verify", "a.zip", "--certificate-identity", id, "--certificate-oidc-issuer", iss, "--trusted-root", sig.TrustedRoot))
			if i == 0 {
				extractManifest(b, filepath.Join(dir, "a.zip"), filepath.Join(dir, audit.FileManifest))
			}
			coSign = append(coSign, exe(cosign, "sign-blob", "--identity-token", tok, "--signing-config", sig.SigningConfig, "--trusted-root", sig.TrustedRoot,
				"--new-bundle-format", "--bundle", "c.json", "--yes", audit.FileManifest))
			coVerify = append(coVerify, exe(cosign, "verify-blob", "--bundle", "c.json", "--trusted-root", sig.TrustedRoot, "--use-signed-timestamps",
				"--certificate-identity", id, "--certificate-oidc-issuer", iss, audit.FileManifest))
			os.Remove(filepath.Join(dir, "a.zip"))
		}
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"gp-sign", gpSign}, {"gp-verify", gpVerify}, {"cosign-sign", coSign}, {"cosign-verify", coVerify}} {
		b.ReportMetric(pct(m.d, 50), m.name+"-p50-ms")
		b.ReportMetric(pct(m.d, 95), m.name+"-p95-ms")
	}
	both := func(a, c []time.Duration) []time.Duration {
		s := make([]time.Duration, len(a))
		for i := range a {
			s[i] = a[i] + c[i]
		}
		return s
	}
	b.ReportMetric(pct(both(gpSign, gpVerify), 50), "gp-total-p50-ms")
	b.ReportMetric(pct(both(gpSign, gpVerify), 95), "gp-total-p95-ms")
	b.ReportMetric(pct(both(coSign, coVerify), 50), "cosign-total-p50-ms")
	b.ReportMetric(pct(both(coSign, coVerify), 95), "cosign-total-p95-ms")
}

// pct is the p-th percentile (nearest rank) of d, in ms.
func pct(d []time.Duration, p int) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	if i < 1 {
		i = 1
	}
	return float64(s[i-1].Microseconds()) / 1000
}

func extractManifest(b *testing.B, zipPath, to string) {
	b.Helper()
	z, err := zip.OpenReader(zipPath)
	if err != nil {
		b.Fatal(err)
	}
	defer z.Close()
	f, err := z.Open(audit.FileManifest)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		b.Fatal(err)
	}
}
