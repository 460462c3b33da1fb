package audit

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// cosignCLI runs the real cosign CLI in dir, hermetically: its TUF cache
// and home live in the test's temp dir, and every command used here is
// offline (key-based, --trusted-root, no tlog).
func cosignCLI(t *testing.T, dir, password string, args ...string) (string, error) {
	t.Helper()
	bin := testutil.Tool(t, "cosign")
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"TUF_ROOT="+filepath.Join(dir, "tuf"),
		"HOME="+dir,
		"COSIGN_PASSWORD="+password,
		"COSIGN_YES=true",
	)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCosignVerifiesGpupassAudit: the stock cosign CLI accepts the
// manifest bundle and the attestation gpupass writes, and rejects a
// tampered manifest.
func TestCosignVerifiesGpupassAudit(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rep := f.build(t, f.run(t), true)
	dir := t.TempDir()
	m := map[string][]byte{}
	for _, e := range entries(t, rep.Zip) {
		m[e.name] = e.data
	}
	pub, err := os.ReadFile("testdata/cosign.pub")
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string][]byte{
		"cosign.pub":        pub,
		"trusted-root.json": []byte(MinimalTrustedRoot),
		FileManifest:        m[FileManifest],
		FileManifestBundle:  m[FileManifestBundle],
		FileAttestation:     m[FileAttestation],
		"tampered.json":     flipByte(m[FileManifest]),
	})
	verify := func(blob string) (string, error) {
		return cosignCLI(t, dir, "", "verify-blob", "--key", "cosign.pub", "--bundle", FileManifestBundle,
			"--trusted-root", "trusted-root.json", "--insecure-ignore-tlog", blob)
	}
	if out, err := verify(FileManifest); err != nil || !strings.Contains(out, "Verified OK") {
		t.Fatalf("cosign verify-blob rejected a gpupass audit: %v\n%s", err, out)
	}
	if out, err := verify("tampered.json"); err == nil {
		t.Fatalf("cosign verify-blob accepted a tampered manifest:\n%s", out)
	}
	out, err := cosignCLI(t, dir, "", "verify-blob-attestation", "--key", "cosign.pub", "--bundle", FileAttestation,
		"--new-bundle-format", "--trusted-root", "trusted-root.json", "--insecure-ignore-tlog", "--type", PredicateType, FileManifest)
	if err != nil || !strings.Contains(out, "Verified OK") {
		t.Fatalf("cosign verify-blob-attestation rejected the gpupass attestation: %v\n%s", err, out)
	}
}

// TestCosignKeySignsGpupassAudit: a key from `cosign generate-key-pair`
// signs with gpupass, and both tools verify the result; a bundle made by
// `cosign sign-blob` passes gpupass verify.
func TestCosignKeySignsGpupassAudit(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	dir := t.TempDir()
	const pw = "cosign-made"
	if out, err := cosignCLI(t, dir, pw, "generate-key-pair"); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
	}
	keyRef := KeyRef(filepath.Join(dir, "cosign.key"))
	if _, err := LoadPrivateKey(keyRef, []byte("wrong"), os.Getenv, nil); !errors.Is(err, ErrWrongPassword) {
		t.Errorf("wrong password: err %v, want ErrWrongPassword", err)
	}
	key, err := LoadPrivateKey(keyRef, []byte(pw), os.Getenv, nil)
	if err != nil {
		t.Fatalf("loading a cosign-made key: %v", err)
	}
	signer, err := NewKeySigner(key, "")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Build(context.Background(), f.run(t), BuildOptions{Signer: signer, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	pub, _, err := LoadPublicKey(KeyRef(filepath.Join(dir, "cosign.pub")), os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	if res := Verify(context.Background(), rep.Zip, VerifyOptions{Key: pub}); !res.OK {
		t.Fatalf("gpupass verify of a cosign-key report failed: %+v", res)
	}
	files := entries(t, rep.Zip)
	writeFiles(t, dir, map[string][]byte{
		"trusted-root.json": []byte(MinimalTrustedRoot),
		FileManifest:        getFrom(t, files, FileManifest),
		FileManifestBundle:  getFrom(t, files, FileManifestBundle),
	})
	if out, err := cosignCLI(t, dir, "", "verify-blob", "--key", "cosign.pub", "--bundle", FileManifestBundle,
		"--trusted-root", "trusted-root.json", "--insecure-ignore-tlog", FileManifest); err != nil {
		t.Fatalf("cosign verify-blob: %v\n%s", err, out)
	}

	// The other direction: cosign signs the manifest, gpupass verifies.
	if out, err := cosignCLI(t, dir, pw, "sign-blob", "--key", "cosign.key", "--bundle", "cosign-made.json",
		"--new-bundle-format", "--tlog-upload=false", FileManifest); err != nil {
		t.Fatalf("cosign sign-blob: %v\n%s", err, out)
	}
	cb, err := os.ReadFile(filepath.Join(dir, "cosign-made.json"))
	if err != nil {
		t.Fatal(err)
	}
	if res := Verify(context.Background(), rezip(t, replace(files, FileManifestBundle, cb)), VerifyOptions{Key: pub}); !res.OK {
		t.Fatalf("gpupass verify rejected a cosign sign-blob bundle: %+v", res)
	}
}
