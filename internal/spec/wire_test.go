package spec_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil"
)

// Every field of a Spec survives Encode and Decode: a field left off the
// wire (json:"-", unexported) would reach the agent empty.
func TestWireKeepsEveryField(t *testing.T) {
	t.Parallel()
	var s spec.Spec
	testutil.FillFields(t, &s)
	b, err := spec.Encode(&s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := spec.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&s, got); diff != "" {
		t.Errorf("Decode(Encode(s)) (-want +got):\n%s", diff)
	}
}

// The agent's fingerprint of what it decodes is the CLI's of the file,
// and the previous release's form (encoding/json) decodes to the same
// spec.
func TestWireKeepsTheFingerprint(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/fingerprint/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no specs in testdata/fingerprint: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc, _ := spec.Parse(f, data)
		if doc == nil {
			t.Fatalf("%s: does not parse", f)
		}
		cli, err := spec.Fingerprint(&doc.Spec)
		if err != nil {
			t.Fatal(err)
		}
		b, err := spec.Encode(&doc.Spec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := spec.Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if fp, err := spec.Fingerprint(got); err != nil || fp != cli {
			t.Errorf("%s: fingerprint after the wire %s (%v), the CLI's %s", f, fp, err, cli)
		}
		old, err := json.Marshal(&doc.Spec)
		if err != nil {
			t.Fatal(err)
		}
		prev, err := spec.Decode(old)
		if err != nil {
			t.Fatalf("%s: the previous release's form: %v", f, err)
		}
		if diff := cmp.Diff(got, prev); diff != "" {
			t.Errorf("%s: the previous release's form decodes otherwise (-wire +previous):\n%s", f, diff)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"yaml":          "name: x\nruntime:\n  cuda: \"12.1\"\n",
		"unknown key":   `{"name":"x","runtime":{"cuda":"12.1","rocm":"6"}}`,
		"trailing data": `{"name":"x"} {"name":"y"}`,
	} {
		if _, err := spec.Decode([]byte(in)); err == nil || !strings.Contains(err.Error(), "decoding the spec (JSON)") {
			t.Errorf("%s: Decode error %v, want a refusal", name, err)
		}
	}
}

// The broker refuses a spec_json that re-encodes to other bytes, so what
// EncodeFile gives a client must survive Decode and Encode byte for byte
// and keep the file's fingerprint; a spec that is not valid gives none.
func TestEncodeFileIsStable(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/fingerprint/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no specs in testdata/fingerprint: %v", err)
	}
	valid := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		res, js, err := spec.EncodeFile(f, data)
		if !res.Valid {
			continue // some only show what the fingerprint hashes
		}
		valid++
		if err != nil || js == nil {
			t.Errorf("%s: EncodeFile = %d bytes, %v", f, len(js), err)
			continue
		}
		sp, err := spec.Decode(js)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		again, err := spec.Encode(sp)
		if err != nil || string(again) != string(js) {
			t.Errorf("%s: re-encoded %s (%v), want %s", f, again, err, js)
		}
		if fp, err := spec.Fingerprint(sp); err != nil || fp != res.Fingerprint {
			t.Errorf("%s: fingerprint of the bytes %s (%v), of the file %s", f, fp, err, res.Fingerprint)
		}
	}
	if valid == 0 {
		t.Fatal("no valid spec in testdata/fingerprint")
	}
	var s spec.Spec
	testutil.FillFields(t, &s)
	b, err := spec.Encode(&s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := spec.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := spec.Encode(got); err != nil || string(again) != string(b) {
		t.Errorf("every field set: re-encoded %s (%v), want %s", again, err, b)
	}
	if res, js, err := spec.EncodeFile("gpupass.yaml", []byte("name: [")); res.Valid || js != nil || err != nil {
		t.Errorf("a spec that does not parse: valid %v, %q, %v; want no bytes and the findings", res.Valid, js, err)
	}
}
