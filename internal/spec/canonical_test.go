package spec

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

func fingerprintOf(t *testing.T, file string) (string, []byte) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	doc, fs := Parse(file, data)
	if doc == nil || len(fs) > 0 {
		t.Fatalf("%s does not parse cleanly: %+v", file, fs)
	}
	fp, err := Fingerprint(&doc.Spec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Canonical(&doc.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return fp, c
}

// TestFingerprintInvariance: formatting, comments, key order, labels,
// resources, the bundle location and spelling variants never change the
// fingerprint; every semantic change does.
func TestFingerprintInvariance(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "fingerprint")
	base, _ := fingerprintOf(t, filepath.Join(dir, "base.yaml"))
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("fingerprint corpus: %v files, err %v", len(files), err)
	}
	seen := map[string]string{}
	for _, f := range files {
		name := filepath.Base(f)
		fp, _ := fingerprintOf(t, f)
		switch {
		case strings.HasPrefix(name, "same-"):
			if fp != base {
				t.Errorf("%s: fingerprint %s, want the base's %s", name, fp, base)
			}
		case strings.HasPrefix(name, "diff-"):
			if fp == base {
				t.Errorf("%s: fingerprint equals the base's; a semantic change must change it", name)
			}
			if other, dup := seen[fp]; dup {
				t.Errorf("%s and %s share a fingerprint", name, other)
			}
			seen[fp] = name
		}
	}
}

// TestFingerprintGolden pins the canonical form and fingerprints: the
// broker, agents and audits compare them across versions, so any change
// here is a compatibility break and must be deliberate (-update).
func TestFingerprintGolden(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "fingerprint")
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	got := map[string]string{}
	for _, f := range files {
		fp, _ := fingerprintOf(t, f)
		got[filepath.Base(f)] = fp
	}
	_, canon := fingerprintOf(t, filepath.Join(dir, "base.yaml"))
	var pretty any
	if err := json.Unmarshal(canon, &pretty); err != nil {
		t.Fatalf("canonical form is not JSON: %v\n%s", err, canon)
	}
	checkGolden(t, filepath.Join(dir, "fingerprints.golden.json"), mustJSON(t, got))
	checkGolden(t, filepath.Join(dir, "base.canonical.json"), append(canon, '\n'))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden (run go test -update): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

func TestCanonicalJCS(t *testing.T) {
	t.Parallel()
	s := &Spec{Runtime: Runtime{
		CUDA: "12.1.105", NvidiaDriver: "535.104.05", Python: "3.10.12", PyTorch: "2.1.0+CU121",
		Packages: []string{"b==1.0", "A_x==2.0", "c-d==\"quoted\""},
	}, Security: Security{FIPSCompliant: true}}
	got, err := Canonical(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"runtime":{"cuda":"12.1.105","cuda-malloc-async":false,"nvidia-driver":"535.104.05",` +
		`"packages":["a-x==2.0","b==1.0","c-d==\"quoted\""],"python":"3.10.12","pytorch":"2.1.0+cu121"},` +
		`"security":{"fips-compliant":true,"no-internet-access":false}}`
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("canonical (-want +got):\n%s", diff)
	}
	// Strings as RFC 8785 writes them (the escapes are canonjson's, tested
	// there with the RFC's vectors); invalid UTF-8 is refused.
	s.Runtime.Packages, s.Runtime.Python = []string{"a\x01b", "<&>", "\u2028é"}, "tab\t"
	got, err = Canonical(s)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"packages":["<&>","a\u0001b","` + "\u2028é" + `"],"python":"tab\t"`; !strings.Contains(string(got), want) {
		t.Errorf("canonical %s, want it to hold %s", got, want)
	}
	s.Runtime.Packages = []string{"bad\xff"}
	if _, err := Canonical(s); err == nil || !strings.Contains(err.Error(), "invalid UTF-8") {
		t.Errorf("Canonical with invalid UTF-8: %v, want an error", err)
	}
	if _, err := Canonical(nil); err == nil {
		t.Error("Canonical(nil) should fail")
	}
}
