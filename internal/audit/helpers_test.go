package audit

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpupass/gpupass/internal/conformance"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/golden")

// testPassword encrypts testdata/cosign.key (written by testdata/gen.go).
const testPassword = "gpupass-test"

type fixture struct {
	signer    *KeySigner
	cosignKey *ecdsa.PrivateKey
	cosignPub crypto.PublicKey
	agentKey  *ecdsa.PrivateKey
	agentPub  []byte
	runJSON   []byte
}

var (
	fixOnce sync.Once
	fix     fixture
	fixErr  error
)

// loadFixture reads the committed keys and run record once per test
// binary: scrypt makes decrypting the cosign key deliberately slow.
func loadFixture(t testing.TB) *fixture {
	t.Helper()
	fixOnce.Do(func() {
		var err error
		// git does not keep mode 0600; copy the key so that loading it
		// does not warn.
		dir, err := os.MkdirTemp("", "audit-fixture-")
		if err != nil {
			fixErr = err
			return
		}
		defer os.RemoveAll(dir)
		kb, err := os.ReadFile("testdata/cosign.key")
		if err != nil {
			fixErr = err
			return
		}
		kp := filepath.Join(dir, "cosign.key")
		if fixErr = os.WriteFile(kp, kb, 0o600); fixErr != nil {
			return
		}
		fix.cosignKey, fixErr = LoadPrivateKey(KeyRef(kp), []byte(testPassword), os.Getenv, nil)
		if fixErr != nil {
			return
		}
		fix.signer, fixErr = NewKeySigner(fix.cosignKey, "")
		if fixErr != nil {
			return
		}
		fix.cosignPub, _, fixErr = LoadPublicKey("testdata/cosign.pub", os.Getenv)
		if fixErr != nil {
			return
		}
		ab, err := os.ReadFile("testdata/agent.key")
		if err != nil {
			fixErr = err
			return
		}
		ak := filepath.Join(dir, "agent.key")
		if fixErr = os.WriteFile(ak, ab, 0o600); fixErr != nil {
			return
		}
		fix.agentKey, fixErr = conformance.LoadOrCreateKey(ak)
		if fixErr != nil {
			return
		}
		fix.agentPub, fixErr = os.ReadFile("testdata/agent.pub")
		if fixErr != nil {
			return
		}
		fix.runJSON, fixErr = os.ReadFile("testdata/run.json")
	})
	if fixErr != nil {
		t.Fatalf("loading fixture: %v", fixErr)
	}
	return &fix
}

// run returns a fresh copy of the fixture run.
func (f *fixture) run(t testing.TB) *Run {
	t.Helper()
	var r Run
	if err := json.Unmarshal(f.runJSON, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// resignReport replaces the run's conformance report by a modified one,
// signed by key.
func (f *fixture) resignReport(t testing.TB, r *Run, key *ecdsa.PrivateKey, mutate func(*conformance.Report)) {
	t.Helper()
	rep, err := conformance.Parse(r.Conformance.Report)
	if err != nil {
		t.Fatal(err)
	}
	mutate(rep)
	b, err := rep.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := conformance.Sign(key, b)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := conformance.PublicKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	r.Conformance = Evidence{Report: b, Signature: sig, AgentPublicKeyPEM: string(pub)}
}

func (f *fixture) build(t testing.TB, r *Run, attest bool) *Report {
	t.Helper()
	rep, err := Build(context.Background(), r, BuildOptions{Signer: f.signer, Attest: attest, Version: "test"})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return rep
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// entries returns the zip's files in order.
func entries(t testing.TB, z []byte) []file {
	t.Helper()
	m, order, err := readZip(z, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	var out []file
	for _, n := range order {
		out = append(out, file{n, m[n]})
	}
	return out
}

func rezip(t testing.TB, files []file) []byte {
	t.Helper()
	z, err := writeZip(files)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// resign rewrites manifest.json for files and signs it with signer: what
// someone holding the cosign key, but not the agent key, could do.
func resign(t testing.TB, files []file, signer Signer) []byte {
	t.Helper()
	var m Manifest
	var out []file
	for _, f := range files {
		switch f.name {
		case FileManifest:
			if err := json.Unmarshal(f.data, &m); err != nil {
				t.Fatal(err)
			}
		case FileManifestBundle, FileAttestation:
		default:
			out = append(out, f)
		}
	}
	m.Files = nil
	for _, f := range out {
		d := sha256.Sum256(f.data)
		m.Files = append(m.Files, ManifestFile{Name: f.name, Size: int64(len(f.data)), SHA256: hex.EncodeToString(d[:])})
	}
	mb, err := marshalIndent(m)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := signer.SignBlob(context.Background(), mb)
	if err != nil {
		t.Fatal(err)
	}
	return rezip(t, append(out, file{FileManifest, mb}, file{FileManifestBundle, bb}))
}

func replace(files []file, name string, data []byte) []file {
	out := make([]file, len(files))
	copy(out, files)
	for i := range out {
		if out[i].name == name {
			out[i].data = data
		}
	}
	return out
}

func flipByte(b []byte) []byte {
	c := bytes.Clone(b)
	c[len(c)/2] ^= 0x01
	return c
}
