package conformance

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sampleReport() *Report {
	return &Report{
		SchemaVersion: SchemaVersion,
		AgentID:       "agent-1",
		GeneratedAt:   "2026-11-29T14:00:00.000Z",
		Simulated:     true,
		Profile:       "h100-sxm5-8x",
		Node:          Node{Provider: "sim", Region: "us-west-2"},
		Runtime:       Runtime{NvidiaDriver: "535.104.05", CUDA: "12.1.105", Packages: map[string]string{"torch": "2.1.0"}},
		GPUs:          []GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-1", MemoryTotalMiB: 81559}},
		Checks:        []Check{{Name: "driver.version", Expected: "535.104.05", Actual: "535.104.05", Status: Pass}},
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	key, err := LoadOrCreateKey(filepath.Join(t.TempDir(), "state", "agent.key"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := PublicKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sampleReport().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := Sign(key, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(pub, b, sig); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sampleReport(), got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}

	tampered := append([]byte(nil), b...)
	tampered[len(tampered)/2] ^= 1
	if err := Verify(pub, tampered, sig); !errors.Is(err, ErrBadSignature) {
		t.Errorf("tampered report: got %v, want ErrBadSignature", err)
	}
	other, _ := LoadOrCreateKey(filepath.Join(t.TempDir(), "other.key"))
	otherPub, _ := PublicKeyPEM(other)
	if err := Verify(otherPub, b, sig); !errors.Is(err, ErrBadSignature) {
		t.Errorf("wrong key: got %v, want ErrBadSignature", err)
	}
	if err := Verify(pub, b, "%%%"); !errors.Is(err, ErrBadSignature) {
		t.Errorf("garbage signature: got %v, want ErrBadSignature", err)
	}
}

func TestLoadOrCreateKeyIsStable(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "agent.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %04o, want 0600", fi.Mode().Perm())
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Equal(k2) {
		t.Error("reloaded key differs: the agent identity would change on restart")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Error("world-readable key accepted")
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"unknown field": `{"schema_version":1,"agent_id":"a","bogus":1}`,
		"wrong schema":  `{"schema_version":2}`,
		"not json":      `nope`,
	} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse accepted %q", name, in)
		}
	}
}
