package spec

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func rulesOf(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Rule)
	}
	return out
}

// TestBadInput feeds hostile and broken files: each must give a clear,
// positioned finding, never a panic, and never a valid result.
func TestBadInput(t *testing.T) {
	t.Parallel()
	manyAliases := "a: &a x\nlist:\n" + strings.Repeat("  - *a\n", maxAliases+1)
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	huge := bytes.Repeat([]byte("# padding line for a very large spec file\n"), (10<<20)/42)
	tests := []struct {
		name     string
		data     []byte
		wantRule string
	}{
		{"10 MB file", huge, "yaml.too-large"},
		{"binary junk", []byte("\x7fELF\x02\x01\x01\x00\x00\x00"), "yaml.encoding"},
		{"invalid utf-8", []byte("name: \xff\xfe\n"), "yaml.encoding"},
		{"NUL byte", []byte("name: a\x00b\n"), "yaml.encoding"},
		{"alias flood", []byte(manyAliases), "yaml.aliases"},
		{"deep nesting", []byte(deep), "yaml.type"},
		{"deeper than yaml.v3 allows", []byte(strings.Repeat("[", 20000) + strings.Repeat("]", 20000)), "yaml.syntax"},
		{"whitespace only", []byte("  \n\n\t\n"), "yaml.empty"},
		{"document marker only", []byte("---\n"), "yaml.empty"},
		{"null root", []byte("~\n"), "yaml.empty"},
		{"unclosed quote", []byte("name: \"abc\nruntime: {}\n"), "yaml.syntax"},
		{"tab after key", []byte("name: x\nruntime:\n  cuda: 12.1.105\n\tpython: 3.10.12\n"), "yaml.syntax"},
		{"self alias", []byte("a: &a [*a]\n"), "yaml.unknown-key"},
		{"cycle through the schema", []byte("name: x\nruntime: &r {cuda: 12.1.105, packages: [*r]}\n"), "yaml.type"},
		{"count: eight", []byte("name: x\nresources: {accelerator: h200, count: \"eight\"}\n"), "yaml.type"},
		{"count overflow", []byte("name: x\nresources: {accelerator: h200, count: 99999999999999999999}\n"), "yaml.type"},
		{"negative size", []byte("name: x\nresources: {accelerator: h200, storage: {type: standard, size_gb: -5}}\n"), "resources.size"},
		{"infinite bandwidth", []byte("name: x\nresources: {accelerator: h200, network: {bandwidth_gbps: .inf}}\n"), "yaml.type"},
		{"key is a mapping", []byte("? {a: b}\n: c\n"), "yaml.type"},
		{"thousands of unknown keys", []byte(strings.Repeat("k: 1\nj: 2\n", 1) + func() string {
			var b strings.Builder
			for i := range 2000 {
				fmt.Fprintf(&b, "key%d: 1\n", i)
			}
			return b.String()
		}()), "spec.truncated"},
		{"node flood", []byte("name: x\nlist: [" + strings.Repeat("1,", maxNodes+1) + "]\n"), "yaml.too-large"},
		{"very long key", []byte(strings.Repeat("k", 100_000) + ": 1\n"), "yaml.syntax"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := Validate("bad.yaml", tt.data)
			if res.Valid {
				t.Fatalf("Valid = true for bad input; findings %+v", res.Findings)
			}
			if !slices.Contains(rulesOf(res.Findings), tt.wantRule) {
				t.Errorf("rules %v, want %s", rulesOf(res.Findings), tt.wantRule)
			}
			for _, f := range res.Findings {
				if f.Line < 1 || f.Column < 1 || f.Message == "" {
					t.Errorf("finding without position or message: %+v", f)
				}
				if len(f.Message) > 2000 {
					t.Errorf("message of %d bytes; long input must be clipped", len(f.Message))
				}
			}
		})
	}
}

// FuzzValidate: no input may panic, hang, or break the invariants every
// renderer relies on. Seeds are the corpus specs; new finds land in
// testdata/fuzz/FuzzValidate.
func FuzzValidate(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "specs", "*.yaml"))
	more, _ := filepath.Glob(filepath.Join("testdata", "fingerprint", "*.yaml"))
	for _, file := range append(files, more...) {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// Environment markers: the spellings of one marker, and broken ones.
	for _, m := range []string{
		`'triton==2.1.0; sys_platform=="linux"'`, `'triton==2.1.0; sys_platform == "linux"'`,
		`"triton==2.1.0; sys_platform == 'linux'"`, `'triton==2.1.0; (os_name=="nt" or extra not in "a")'`,
		`'triton==2.1.0; sys_platform = "linux"'`, `'triton==2.1.0; sys_platform == "linux'`,
		`'triton==2.1.0; (python_version >= "3.9"'`, `'triton==2.1.0; python_verison >= "3.9"'`,
	} {
		f.Add([]byte("name: m\nruntime:\n  cuda: 12.1.105\n  nvidia-driver: 535.104.05\n  python: 3.10.12\n" +
			"  pytorch: 2.1.2+cu121\n  packages:\n    - " + m + "\n"))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		res := Validate("fuzz.yaml", data)
		errs, warns := Counts(res.Findings)
		if errs != res.Errors || warns != res.Warnings {
			t.Fatalf("counts %d/%d disagree with findings %d/%d", res.Errors, res.Warnings, errs, warns)
		}
		if res.Valid != (res.Spec != nil && errs == 0) {
			t.Fatalf("Valid = %v with spec %v and %d errors", res.Valid, res.Spec != nil, errs)
		}
		for _, fd := range res.Findings {
			if fd.Line < 1 || fd.Column < 1 || fd.Rule == "" || fd.Message == "" {
				t.Fatalf("bad finding %+v", fd)
			}
			if !utf8.ValidString(fd.Message) {
				t.Fatalf("finding message is not UTF-8: %q", fd.Message)
			}
		}
		if !res.Valid {
			return
		}
		// A valid spec has a stable fingerprint and canonical JSON.
		c1, err := Canonical(res.Spec)
		if err != nil {
			t.Fatalf("Canonical of a valid spec: %v", err)
		}
		fp, _ := Fingerprint(res.Spec)
		if fp != res.Fingerprint || !bytes.Equal(c1, res.Canonical) {
			t.Fatalf("fingerprint not deterministic: %s vs %s", fp, res.Fingerprint)
		}
		if !strings.HasPrefix(fp, "sha256:") || len(fp) != len("sha256:")+64 {
			t.Fatalf("malformed fingerprint %q", fp)
		}
	})
}

func ExampleFingerprint() {
	res := Validate("gpupass.yaml", []byte(`name: demo
runtime:
  cuda: 12.1.105
  nvidia-driver: 535.104.05
  python: 3.10.12
  pytorch: 2.1.2+cu121
  packages: [numpy==1.26.4]
`))
	fp, _ := Fingerprint(res.Spec)
	fmt.Println(res.Valid, fp == res.Fingerprint, string(res.Canonical))
	// Output: true true {"runtime":{"cuda":"12.1.105","cuda-malloc-async":false,"nvidia-driver":"535.104.05","packages":["numpy==1.26.4"],"python":"3.10.12","pytorch":"2.1.2+cu121"},"security":{"fips-compliant":false,"no-internet-access":false}}
}
