package spec

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkValidate measures parse + rules + fingerprint of one spec,
// in-process. scripts/bench.d/10-validate.sh reports it.
func BenchmarkValidate(b *testing.B) {
	for _, name := range []string{"design-example-fixed", "valid-starter", "packages-unpinned"} {
		data, err := os.ReadFile(filepath.Join("testdata", "specs", name+".yaml"))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if res := Validate("gpupass.yaml", data); len(res.Findings) == 0 && !res.Valid {
					b.Fatal("no result")
				}
			}
		})
	}
}

// BenchmarkFingerprint measures the canonical form and hash alone, the
// part the broker and agents call on every report.
func BenchmarkFingerprint(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("testdata", "fingerprint", "base.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	doc, _ := Parse("base.yaml", data)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Fingerprint(&doc.Spec); err != nil {
			b.Fatal(err)
		}
	}
}
