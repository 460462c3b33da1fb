package audit

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/fielderr"
)

func layerNames(res *Result) []string {
	var out []string
	for _, l := range res.Layers {
		out = append(out, l.Name)
	}
	return out
}

func problemFiles(res *Result, layer string) []string {
	var out []string
	for _, l := range res.Layers {
		if l.Name == layer {
			for _, p := range l.Problems {
				out = append(out, p.File+":"+p.Check)
			}
		}
	}
	return out
}

func TestBuildVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	for _, attest := range []bool{false, true} {
		rep := f.build(t, f.run(t), attest)
		res := Verify(context.Background(), rep.Zip, VerifyOptions{Key: f.cosignPub, AgentKeys: []AgentKey{{PEM: f.agentPub}}})
		if !res.OK {
			t.Fatalf("attest=%v: verify failed: %+v", attest, res)
		}
		want := []string{LayerArchive, LayerSignature, LayerManifest, LayerAgent, LayerFingerprint, LayerLog}
		if attest {
			want = append(want, LayerAttestation)
		}
		if diff := cmp.Diff(want, layerNames(res)); diff != "" {
			t.Errorf("attest=%v: layers (-want +got):\n%s", attest, diff)
		}
		if !res.Simulated || !rep.Manifest.Simulated {
			t.Errorf("simulated run not flagged: result %v manifest %v", res.Simulated, rep.Manifest.Simulated)
		}
		var names []string
		for _, e := range entries(t, rep.Zip) {
			names = append(names, e.name)
		}
		wantNames := []string{FileEnvironment, FileConformanceReport, FileConformanceSig, FileAgentKey, FileConformanceLog, FileHardware, FileRunSummary, FileManifest, FileManifestBundle}
		if attest {
			wantNames = append(wantNames, FileAttestation)
		}
		if diff := cmp.Diff(wantNames, names); diff != "" {
			t.Errorf("zip entries (-want +got):\n%s", diff)
		}
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	a := f.build(t, f.run(t), true)
	b := f.build(t, f.run(t), true)
	if !bytes.Equal(a.Zip, b.Zip) {
		t.Fatal("the same run built twice gives different zips")
	}
	zr, err := zip.NewReader(bytes.NewReader(a.Zip), int64(len(a.Zip)))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range zr.File {
		if !e.Modified.Equal(zipTime) {
			t.Errorf("%s: modified %v, want fixed %v", e.Name, e.Modified, zipTime)
		}
	}
}

// TestGolden pins every file of the fixture run's report (keys and run
// are fixed, signatures deterministic). Update with -update.
func TestGolden(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), true)
	for _, e := range entries(t, rep.Zip) {
		path := filepath.Join("testdata", "golden", e.name)
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, e.data, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update)", err)
		}
		if diff := cmp.Diff(string(want), string(e.data)); diff != "" {
			t.Errorf("%s (-golden +got):\n%s", e.name, diff)
		}
	}
}

func TestTamperEachFile(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), true)
	files := entries(t, rep.Zip)
	want := map[string]struct {
		layer   string
		problem string
	}{
		FileEnvironment:       {LayerManifest, FileEnvironment + ":sha256"},
		FileConformanceReport: {LayerManifest, FileConformanceReport + ":sha256"},
		FileConformanceSig:    {LayerManifest, FileConformanceSig + ":sha256"},
		FileAgentKey:          {LayerManifest, FileAgentKey + ":sha256"},
		FileConformanceLog:    {LayerManifest, FileConformanceLog + ":sha256"},
		FileHardware:          {LayerManifest, FileHardware + ":sha256"},
		FileRunSummary:        {LayerManifest, FileRunSummary + ":sha256"},
		FileManifest:          {LayerSignature, FileManifestBundle + ":cosign-signature"},
		FileManifestBundle:    {LayerSignature, FileManifestBundle + ":cosign-signature"},
		FileAttestation:       {LayerAttestation, FileAttestation + ":dsse-signature"},
	}
	if len(want) != len(files) {
		t.Fatalf("table covers %d files, the report has %d", len(want), len(files))
	}
	for _, e := range files {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			w, ok := want[e.name]
			if !ok {
				t.Fatalf("no expectation for %s", e.name)
			}
			z := rezip(t, replace(files, e.name, flipByte(e.data)))
			res := Verify(context.Background(), z, VerifyOptions{Key: f.cosignPub})
			if res.OK {
				t.Fatalf("tampered %s verified", e.name)
			}
			if res.FailedLayer != w.layer {
				t.Errorf("failed layer %q, want %q (%+v)", res.FailedLayer, w.layer, res.Layers)
			}
			if got := problemFiles(res, w.layer); !contains(got, w.problem) {
				t.Errorf("problems in %s: %v, want one %q", w.layer, got, w.problem)
			}
		})
	}
}

func getFrom(t testing.TB, files []file, name string) []byte {
	t.Helper()
	for _, e := range files {
		if e.name == name {
			return e.data
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestRemovedAndAddedFiles(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), false)
	files := entries(t, rep.Zip)
	for _, e := range files {
		t.Run("remove "+e.name, func(t *testing.T) {
			t.Parallel()
			var kept []file
			for _, g := range files {
				if g.name != e.name {
					kept = append(kept, g)
				}
			}
			res := Verify(context.Background(), rezip(t, kept), VerifyOptions{Key: f.cosignPub})
			if res.OK {
				t.Fatalf("report without %s verified", e.name)
			}
			var found bool
			for _, l := range res.Layers {
				for _, p := range l.Problems {
					if p.File == e.name && (p.Check == "present") {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("no problem names the missing %s: %+v", e.name, res.Layers)
			}
		})
	}
	t.Run("add file", func(t *testing.T) {
		t.Parallel()
		res := Verify(context.Background(), rezip(t, append(files, file{"notes.txt", []byte("trust me")})), VerifyOptions{Key: f.cosignPub})
		if res.OK || res.FailedLayer != LayerManifest {
			t.Fatalf("added file: ok=%v failed=%q", res.OK, res.FailedLayer)
		}
		if diff := cmp.Diff([]string{"notes.txt:unlisted"}, problemFiles(res, LayerManifest)); diff != "" {
			t.Errorf("problems (-want +got):\n%s", diff)
		}
	})
}

func TestSignatureAndKeys(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), false)
	files := entries(t, rep.Zip)

	other := f.run(t)
	other.Restarts = 5
	otherRep := f.build(t, other, false)
	var otherBundle []byte
	for _, e := range entries(t, otherRep.Zip) {
		if e.name == FileManifestBundle {
			otherBundle = e.data
		}
	}
	wrongKey := newKey(t)
	wrongSigner, err := NewKeySigner(wrongKey, "")
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		zip     []byte
		opts    VerifyOptions
		layer   string
		problem string
	}{
		{"swapped bundle from another report", rezip(t, replace(files, FileManifestBundle, otherBundle)), VerifyOptions{Key: f.cosignPub}, LayerSignature, FileManifestBundle + ":cosign-signature"},
		{"wrong verification key", rep.Zip, VerifyOptions{Key: wrongKey.Public()}, LayerSignature, FileManifestBundle + ":cosign-signature"},
		{"re-signed with another key", resign(t, files, wrongSigner), VerifyOptions{Key: f.cosignPub}, LayerSignature, FileManifestBundle + ":cosign-signature"},
		{"no key", rep.Zip, VerifyOptions{}, LayerSignature, FileManifestBundle + ":cosign-signature"},
		{"bundle not json", rezip(t, replace(files, FileManifestBundle, []byte("{"))), VerifyOptions{Key: f.cosignPub}, LayerSignature, FileManifestBundle + ":cosign-signature"},
		{"unknown agent key", rep.Zip, VerifyOptions{Key: f.cosignPub, AgentKeys: []AgentKey{{PEM: mustPEM(t, newKey(t))}}}, LayerAgent, FileAgentKey + ":known-agent-key"},
		{"expired agent key", rep.Zip, VerifyOptions{Key: f.cosignPub, AgentKeys: []AgentKey{{PEM: f.agentPub, NotAfter: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}}, LayerAgent, FileAgentKey + ":agent-key-validity"},
		{"agent key not yet valid", rep.Zip, VerifyOptions{Key: f.cosignPub, AgentKeys: []AgentKey{{PEM: f.agentPub, NotBefore: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)}}}, LayerAgent, FileAgentKey + ":agent-key-validity"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := Verify(context.Background(), tc.zip, tc.opts)
			if res.OK || res.FailedLayer != tc.layer {
				t.Fatalf("ok=%v failed=%q, want layer %q: %+v", res.OK, res.FailedLayer, tc.layer, res.Layers)
			}
			if got := problemFiles(res, tc.layer); !contains(got, tc.problem) {
				t.Errorf("problems %v, want %q", got, tc.problem)
			}
		})
	}
}

func mustPEM(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := conformance.PublicKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// replaceLast replaces the last occurrence of old in b.
func replaceLast(b []byte, old, new string) []byte {
	i := bytes.LastIndex(b, []byte(old))
	if i < 0 {
		return b
	}
	return append(append(bytes.Clone(b[:i]), new...), b[i+len(old):]...)
}

// TestAgentAndFingerprintLayers forges reports with the cosign key (so
// the signature and manifest layers pass) to check the inner layers alone.
func TestAgentAndFingerprintLayers(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	base := entries(t, f.build(t, f.run(t), false).Zip)
	get := func(name string) []byte { return getFrom(t, base, name) }
	// A report from an impostor agent that claims the real agent's key.
	imp := f.run(t)
	f.resignReport(t, imp, newKey(t), func(r *conformance.Report) { r.AgentID = "impostor" })
	// A report, properly signed, of a different environment.
	drift := f.run(t)
	f.resignReport(t, drift, f.agentKey, func(r *conformance.Report) { r.RuntimeFingerprint = "sha256:0000" })
	driftFiles := entries(t, f.build(t, drift, false).Zip)
	// Another run's report by the same agent, swapped in with its signature.
	other := f.run(t)
	f.resignReport(t, other, f.agentKey, func(r *conformance.Report) { r.AllocationID = "alloc-other" })
	otherFiles := replace(replace(base, FileConformanceReport, other.Conformance.Report), FileConformanceSig, []byte(other.Conformance.Signature))
	// A report measured against another spec.
	otherSpec := f.run(t)
	f.resignReport(t, otherSpec, f.agentKey, func(r *conformance.Report) { r.SpecFingerprint = "sha256:1111" })
	otherSpecFiles := entries(t, f.build(t, otherSpec, false).Zip)

	tests := []struct {
		name    string
		files   []file
		layer   string
		problem string
	}{
		{"agent signature over another report", replace(base, FileConformanceReport, imp.Conformance.Report), LayerAgent, FileConformanceReport + ":agent-signature"},
		{"agent signature swapped", replace(base, FileConformanceSig, []byte(imp.Conformance.Signature)), LayerAgent, FileConformanceReport + ":agent-signature"},
		{"agent key swapped", replace(base, FileAgentKey, []byte(imp.Conformance.AgentPublicKeyPEM)), LayerAgent, FileConformanceReport + ":agent-signature"},
		{"agent key garbage", replace(base, FileAgentKey, []byte("not a key")), LayerAgent, FileAgentKey + ":agent-key"},
		{"another run's report", otherFiles, LayerFingerprint, FileConformanceReport + ":run-report"},
		{"measured against another spec", otherSpecFiles, LayerFingerprint, FileConformanceReport + ":spec-fingerprint"},
		{"measured fingerprint differs", driftFiles, LayerFingerprint, FileConformanceReport + ":fingerprint-match"},
		{"environment claims a match", replace(driftFiles, FileEnvironment, replaceLast(getFrom(t, driftFiles, FileEnvironment), `"match": false`, `"match": true`)), LayerFingerprint, FileEnvironment + ":match"},
		{"environment file lies about measured", replace(base, FileEnvironment, replaceLast(get(FileEnvironment), `"fingerprint": "sha256:cd6f`, `"fingerprint": "sha256:cd6e`)), LayerFingerprint, FileEnvironment + ":measured-fingerprint"},
		{"declared fingerprint changed", replace(base, FileEnvironment, bytes.Replace(get(FileEnvironment), []byte(`"fingerprint": "sha256:cd6f`), []byte(`"fingerprint": "sha256:cd6e`), 1)), LayerFingerprint, FileConformanceReport + ":fingerprint-match"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			z := resign(t, tc.files, f.signer)
			res := Verify(context.Background(), z, VerifyOptions{Key: f.cosignPub})
			if res.OK || res.FailedLayer != tc.layer {
				t.Fatalf("ok=%v failed=%q, want %q: %+v", res.OK, res.FailedLayer, tc.layer, res.Layers)
			}
			if got := problemFiles(res, tc.layer); !contains(got, tc.problem) {
				t.Errorf("problems %v, want %q", got, tc.problem)
			}
		})
	}
}

func TestUnsafeArchives(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	good := entries(t, f.build(t, f.run(t), false).Zip)

	raw := func(add func(zw *zip.Writer)) []byte {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		for _, e := range good {
			w, _ := zw.Create(e.name)
			w.Write(e.data)
		}
		add(zw)
		zw.Close()
		return buf.Bytes()
	}
	entry := func(name string, data []byte) func(*zip.Writer) {
		return func(zw *zip.Writer) {
			w, err := zw.Create(name)
			if err != nil {
				t.Fatal(err)
			}
			w.Write(data)
		}
	}
	bomb := func(zw *zip.Writer) {
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: "bomb.bin", Method: zip.Deflate})
		zeros := make([]byte, 1<<20)
		for range 65 {
			w.Write(zeros)
		}
	}
	symlink := func(zw *zip.Writer) {
		h := &zip.FileHeader{Name: "link"}
		h.SetMode(os.ModeSymlink | 0o777)
		w, _ := zw.CreateHeader(h)
		w.Write([]byte("/etc/passwd"))
	}
	many := func(zw *zip.Writer) {
		for i := range DefaultLimits.MaxEntries + 6 {
			w, _ := zw.Create("f" + strings.Repeat("x", i))
			w.Write([]byte("x"))
		}
	}
	tests := []struct {
		name string
		zip  []byte
		want string
	}{
		{"traversal", raw(entry("../../etc/cron.d/x", []byte("x"))), "path separators"},
		{"dotdot", raw(entry("..", []byte("x"))), `".."`},
		{"absolute", raw(entry("/etc/passwd", []byte("x"))), "path separators"},
		{"backslash", raw(entry(`..\..\x`, []byte("x"))), "path separators"},
		{"directory", raw(entry("sub/", nil)), "path separators"},
		{"duplicate", raw(entry(FileHardware, []byte("{}"))), "appears twice"},
		{"symlink", raw(symlink), "not a regular file"},
		{"zip bomb", raw(bomb), "zip bomb"},
		{"too many entries", raw(many), "entries, at most"},
		{"not a zip", []byte("PK\x03\x04 nope"), "not a zip"},
		{"empty", nil, "not a zip"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := Verify(context.Background(), tc.zip, VerifyOptions{Key: f.cosignPub})
			if res.OK || res.FailedLayer != LayerArchive {
				t.Fatalf("ok=%v failed=%q, want archive", res.OK, res.FailedLayer)
			}
			if msg := res.Layers[0].Problems[0].Message; !strings.Contains(msg, tc.want) {
				t.Errorf("message %q does not contain %q", msg, tc.want)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyPath, pubPath, err := WriteKeyPair(filepath.Join(dir, "k"), []byte("pw"), false)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("private key mode %04o, want 0600", fi.Mode().Perm())
	}
	var fe *fielderr.Error
	if _, _, err := WriteKeyPair(filepath.Join(dir, "k"), []byte("pw"), false); !errors.As(err, &fe) || fe.Field != FieldForce || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("overwrite without force: %v", err)
	}
	keyPEM, _ := os.ReadFile(keyPath)
	if !bytes.Contains(keyPEM, []byte("ENCRYPTED SIGSTORE PRIVATE KEY")) {
		t.Errorf("key is not in cosign's encrypted format:\n%s", keyPEM)
	}
	env := map[string]string{"MYKEY": string(keyPEM)}
	getenv := func(k string) string { return env[k] }

	loose := filepath.Join(dir, "loose.key")
	if err := os.WriteFile(loose, keyPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		ref     KeyRef
		pw      string
		wantErr error
		errText string
		warn    bool
	}{
		{"file", KeyRef(keyPath), "pw", nil, "", false},
		{"env", "env://MYKEY", "pw", nil, "", false},
		{"wrong password", KeyRef(keyPath), "nope", ErrWrongPassword, "", false},
		{"empty env", "env://NOPE", "pw", nil, "empty or unset", false},
		{"public key given", KeyRef(pubPath), "pw", nil, "public key", false},
		{"missing file", KeyRef(filepath.Join(dir, "none")), "pw", nil, "no such file", false},
		{"loose permissions warn", KeyRef(loose), "pw", nil, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logBuf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logBuf, nil))
			k, err := LoadPrivateKey(tc.ref, []byte(tc.pw), getenv, log)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
			case tc.errText != "":
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err %v, want %q", err, tc.errText)
				}
			case err != nil:
				t.Fatal(err)
			case k == nil:
				t.Fatal("nil key")
			}
			if err != nil && strings.Contains(err.Error(), "pw") && tc.pw == "pw" {
				t.Errorf("error leaks the password: %v", err)
			}
			if got := strings.Contains(logBuf.String(), "chmod 600"); got != tc.warn {
				t.Errorf("warned=%v, want %v: %s", got, tc.warn, logBuf.String())
			}
		})
	}
}

func TestRunValidation(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	tests := []struct {
		name   string
		mutate func(*Run)
		want   string
	}{
		{"in progress", func(r *Run) { r.State = "running" }, "still in progress"},
		{"no spec", func(r *Run) { r.SpecBytes = "" }, "spec_bytes"},
		{"no report", func(r *Run) { r.Conformance.Report = nil }, "conformance.report"},
		{"bad agent key", func(r *Run) { r.Conformance.AgentPublicKeyPEM = "x" }, "agent_public_key_pem"},
		{"time reversed", func(r *Run) { r.FinishedAt = r.StartedAt.Add(-time.Hour) }, "before started_at"},
		{"bad agent signature", func(r *Run) { r.Conformance.Signature = "AAAA" }, "record is corrupt"},
		{"the node's periodic report", func(r *Run) {
			f.resignReport(t, r, f.agentKey, func(c *conformance.Report) { c.AllocationID, c.SpecFingerprint = "", "" })
		}, "periodic report"},
		{"another run's report", func(r *Run) {
			f.resignReport(t, r, f.agentKey, func(c *conformance.Report) { c.AllocationID = "alloc-other" })
		}, "measured for allocation alloc-other"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := f.run(t)
			tc.mutate(r)
			_, err := Build(context.Background(), r, BuildOptions{Signer: f.signer})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	r := f.run(t)
	r.State = "running"
	if _, err := Build(context.Background(), r, BuildOptions{Signer: f.signer}); !errors.Is(err, ErrInProgress) {
		t.Errorf("in-progress error is not ErrInProgress: %v", err)
	}
}

func TestSummarizeMetrics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		points []MetricPoint
		want   []MetricSummary
	}{
		{"empty", nil, []MetricSummary{}},
		{"out of order with a NaN", []MetricPoint{
			{Name: "loss", Step: 2, Value: 1},
			{Name: "loss", Step: 1, Value: 3},
			{Name: "loss", Step: 3, Value: math.NaN()},
			{Name: "acc", Step: 1, Value: 0.5},
		}, []MetricSummary{
			{Name: "acc", Count: 1, FirstStep: 1, LastStep: 1, First: 0.5, Last: 0.5, Min: 0.5, Max: 0.5, Mean: 0.5},
			{Name: "loss", Count: 3, NonFinite: 1, FirstStep: 1, LastStep: 2, First: 3, Last: 1, Min: 1, Max: 3, Mean: 2},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, SummarizeMetrics(tc.points)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestFingerprintRecomputed(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), false)
	// Stand-in for spec.Fingerprint: what matters here is that verify
	// feeds it the declared source and compares.
	const fp = "sha256:cd6f957688f2b440eb608e433f8de5d546e92ee7827a6da7a72230c50b479a8f"
	tests := []struct {
		name    string
		fn      func(string, []byte) (string, error)
		wantOK  bool
		problem string
	}{
		{"same", func(file string, src []byte) (string, error) {
			if file != "gpupass.yaml" || !bytes.HasPrefix(src, []byte("name: llm-finetune")) {
				return "", errors.New("unexpected input")
			}
			return fp, nil
		}, true, ""},
		{"differs", func(string, []byte) (string, error) { return "sha256:other", nil }, false, FileEnvironment + ":declared-recomputed"},
		{"does not parse", func(string, []byte) (string, error) { return "", errors.New("line 1: bad") }, false, FileEnvironment + ":declared-recomputed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := Verify(context.Background(), rep.Zip, VerifyOptions{Key: f.cosignPub, Fingerprint: tc.fn})
			if res.OK != tc.wantOK {
				t.Fatalf("ok=%v, want %v: %+v", res.OK, tc.wantOK, res.Layers)
			}
			if !tc.wantOK && !contains(problemFiles(res, LayerFingerprint), tc.problem) {
				t.Errorf("problems %v, want %q", problemFiles(res, LayerFingerprint), tc.problem)
			}
		})
	}
}

func TestExtract(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), false)
	dir := filepath.Join(t.TempDir(), "out")
	names, err := Extract(rep.Zip, dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries(t, rep.Zip) {
		b, err := os.ReadFile(filepath.Join(dir, e.name))
		if err != nil || !bytes.Equal(b, e.data) {
			t.Errorf("%s: extracted content differs (%v)", e.name, err)
		}
	}
	if len(names) != 9 {
		t.Errorf("extracted %d files, want 9", len(names))
	}
	// Never overwrite: a second extraction into the same dir fails.
	if _, err := Extract(rep.Zip, dir, Limits{}); err == nil {
		t.Error("second extraction overwrote files")
	}
	// A planted symlink cannot redirect a write outside dir.
	dir2 := t.TempDir()
	outside := filepath.Join(t.TempDir(), "target")
	if err := os.Symlink(outside, filepath.Join(dir2, FileHardware)); err != nil {
		t.Fatal(err)
	}
	if _, err := Extract(rep.Zip, dir2, Limits{}); err == nil {
		t.Error("extraction followed a planted symlink")
	}
	if _, err := os.Stat(outside); err == nil {
		t.Error("a file was written outside the extraction dir")
	}
	// Traversal entries are refused before anything is written.
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	w, _ := zw.Create("../escape.txt")
	w.Write([]byte("x"))
	zw.Close()
	dir3 := t.TempDir()
	if _, err := Extract(buf.Bytes(), filepath.Join(dir3, "x"), Limits{}); !errors.Is(err, ErrUnsafeArchive) {
		t.Errorf("traversal: err %v, want ErrUnsafeArchive", err)
	}
	if _, err := os.Stat(filepath.Join(dir3, "escape.txt")); err == nil {
		t.Error("traversal entry was written")
	}
}

// TestAttestationStatement signs attestations with the real cosign key
// (so the DSSE signature verifies) that are not the report's statement.
func TestAttestationStatement(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), true)
	files := entries(t, rep.Zip)
	ctx := context.Background()
	signStatement := func(payloadType string, mutate func(*statement)) []byte {
		t.Helper()
		b, err := Statement(rep.Manifest, rep.ManifestSHA256, rep.Environment)
		if err != nil {
			t.Fatal(err)
		}
		var st statement
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		mutate(&st)
		if b, err = json.Marshal(st); err != nil {
			t.Fatal(err)
		}
		att, err := f.signer.SignDSSE(ctx, payloadType, b)
		if err != nil {
			t.Fatal(err)
		}
		return att
	}
	tests := []struct {
		name        string
		attestation []byte
		problem     string // empty: verifies; alternatives separated by |
	}{
		{"as built", signStatement(InTotoPayloadType, func(*statement) {}), ""},
		{"manifest bundle in its place", getFrom(t, files, FileManifestBundle), FileAttestation + ":dsse-envelope"},
		// sigstore-go refuses a payload that is not in-toto before
		// verifyAttestation looks; either refusal will do.
		{"other payload type", signStatement("application/json", func(*statement) {}), FileAttestation + ":dsse-signature|" + FileAttestation + ":dsse-envelope"},
		{"other statement type", signStatement(InTotoPayloadType, func(s *statement) { s.Type = "https://in-toto.io/Statement/v0.1" }), FileAttestation + ":statement-type"},
		{"other predicate type", signStatement(InTotoPayloadType, func(s *statement) { s.PredicateType = "https://slsa.dev/provenance/v1" }), FileAttestation + ":predicate-type"},
		{"only the manifest as subject", signStatement(InTotoPayloadType, func(s *statement) { s.Subject = s.Subject[:1] }), FileAttestation + ":subject"},
		{"other declared fingerprint", signStatement(InTotoPayloadType, func(s *statement) { s.Predicate.DeclaredFingerprint = "sha256:00" }), FileAttestation + ":predicate"},
		{"match claimed", signStatement(InTotoPayloadType, func(s *statement) { s.Predicate.Match = !s.Predicate.Match }), FileAttestation + ":predicate"},
		{"other allocation", signStatement(InTotoPayloadType, func(s *statement) { s.Predicate.AllocationID = "alloc-other" }), FileAttestation + ":predicate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := Verify(ctx, rezip(t, replace(files, FileAttestation, tc.attestation)), VerifyOptions{Key: f.cosignPub})
			if tc.problem == "" {
				if !res.OK {
					t.Fatalf("verify failed: %+v", res.Layers)
				}
				return
			}
			if res.OK || res.FailedLayer != LayerAttestation {
				t.Fatalf("ok=%v failed=%q, want layer %q: %+v", res.OK, res.FailedLayer, LayerAttestation, res.Layers)
			}
			got := problemFiles(res, LayerAttestation)
			if !slices.ContainsFunc(strings.Split(tc.problem, "|"), func(p string) bool { return contains(got, p) }) {
				t.Errorf("problems %v, want %q", got, tc.problem)
			}
		})
	}
}

// A run's log is recorded in run-summary.json and verify fails the log
// layer unless it was complete and undisputed (DESIGN §10).
func TestVerifyLogLayer(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	for _, tc := range []struct {
		name    string
		log     *Log
		wantOK  bool
		problem string
	}{
		{"not recorded (older source)", nil, true, ""},
		{"complete", &Log{LastSeq: 20, HeldThrough: 20}, true, ""},
		{"disputed", &Log{LastSeq: 20, HeldThrough: 20, DisputedRecords: 2, FirstDisputedSeq: 7}, false, "log disputed: 2 record(s) were sent twice with different content (first at seq 7)"},
		{"incomplete", &Log{LastSeq: 20, HeldThrough: 12}, false, "log incomplete: the broker holds seqs 1..12 without a gap, the agent spooled 20"},
		{"a complete flag set by the source is recomputed", &Log{LastSeq: 20, HeldThrough: 20, DisputedRecords: 1, Complete: true}, false, "log disputed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := f.run(t)
			r.Log = tc.log
			res := Verify(context.Background(), f.build(t, r, false).Zip, VerifyOptions{Key: f.cosignPub, AgentKeys: []AgentKey{{PEM: f.agentPub}}})
			var got *Layer
			for i := range res.Layers {
				if res.Layers[i].Name == LayerLog {
					got = &res.Layers[i]
				}
			}
			if got == nil || got.OK != tc.wantOK || res.OK != tc.wantOK {
				t.Fatalf("log layer %+v, result ok %v; want ok %v", got, res.OK, tc.wantOK)
			}
			if !tc.wantOK && (res.FailedLayer != LayerLog || len(got.Problems) != 1 || !strings.Contains(got.Problems[0].Message, tc.problem)) {
				t.Errorf("failed layer %s, problems %+v; want the log layer saying %q", res.FailedLayer, got.Problems, tc.problem)
			}
		})
	}
}

// TestVerifyLayerStatus: without pinned agent keys the agent-signature
// layer warns (the report still verifies) unless pinning is required; a
// layer that reads a file which failed the manifest check is skipped, not
// run over contents nobody signed.
func TestVerifyLayerStatus(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), true)
	files := entries(t, rep.Zip)
	var report, summary []byte
	for _, e := range files {
		switch e.name {
		case FileConformanceReport:
			report = e.data
		case FileRunSummary:
			summary = e.data
		}
	}
	pinned := []AgentKey{{PEM: f.agentPub}}
	tests := []struct {
		name   string
		zip    []byte
		opts   VerifyOptions
		ok     bool
		want   map[string]string
		warned bool
	}{
		{"unpinned warns", rep.Zip, VerifyOptions{Key: f.cosignPub}, true,
			map[string]string{LayerAgent: StatusWarn, LayerFingerprint: StatusOK, LayerAttestation: StatusOK}, true},
		{"unpinned with pinning required fails", rep.Zip, VerifyOptions{Key: f.cosignPub, RequirePinned: true}, false,
			map[string]string{LayerAgent: StatusFail}, false},
		{"pinned is ok", rep.Zip, VerifyOptions{Key: f.cosignPub, AgentKeys: pinned, RequirePinned: true}, true,
			map[string]string{LayerAgent: StatusOK}, false},
		{"a changed conformance report skips the layers that read it", rezip(t, replace(files, FileConformanceReport, flipByte(report))), VerifyOptions{Key: f.cosignPub, AgentKeys: pinned}, false,
			map[string]string{LayerManifest: StatusFail, LayerAgent: StatusSkipped, LayerFingerprint: StatusSkipped, LayerLog: StatusOK, LayerAttestation: StatusOK}, false},
		{"a changed run summary skips the log layer", rezip(t, replace(files, FileRunSummary, flipByte(summary))), VerifyOptions{Key: f.cosignPub, AgentKeys: pinned}, false,
			map[string]string{LayerManifest: StatusFail, LayerAgent: StatusOK, LayerLog: StatusSkipped}, false},
		{"an unreadable manifest skips every layer that reads a file", rezip(t, replace(files, FileManifest, []byte("{"))), VerifyOptions{Key: f.cosignPub, AgentKeys: pinned}, false,
			map[string]string{LayerManifest: StatusFail, LayerAgent: StatusSkipped, LayerFingerprint: StatusSkipped, LayerLog: StatusSkipped, LayerAttestation: StatusSkipped}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := Verify(context.Background(), tc.zip, tc.opts)
			got := map[string]string{}
			for _, l := range res.Layers {
				if _, ok := tc.want[l.Name]; ok {
					got[l.Name] = l.Status
				}
				if l.OK != (l.Status == StatusOK || l.Status == StatusWarn) {
					t.Errorf("layer %s: ok %v with status %q", l.Name, l.OK, l.Status)
				}
				if l.Status == StatusSkipped && (!strings.Contains(l.Detail, "not checked: ") || len(l.Problems) > 0) {
					t.Errorf("skipped layer %s: detail %q, problems %v", l.Name, l.Detail, l.Problems)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("layer statuses (-want +got):\n%s", d)
			}
			if res.OK != tc.ok {
				t.Errorf("ok %v, want %v: %+v", res.OK, tc.ok, res.Layers)
			}
			if (len(res.Warnings) > 0) != tc.warned || res.AgentKeyPinned != (len(tc.opts.AgentKeys) > 0) {
				t.Errorf("warnings %q, agent_key_pinned %v", res.Warnings, res.AgentKeyPinned)
			}
		})
	}
}
