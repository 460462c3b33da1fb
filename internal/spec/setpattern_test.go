package spec

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSetMetricPattern(t *testing.T) {
	t.Parallel()
	base, err := os.ReadFile(filepath.Join("testdata", "specs", "time-limit-ok.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := fingerprintBytes(t, base)
	const pat = `\| loss\s+(?P<loss>\S+) \|`
	for name, in := range map[string][]byte{
		"added":    base,
		"replaced": append(append([]byte{}, base...), "metrics:\n  pattern: 'old (?P<loss>x)'\n"...),
		"null":     append(append([]byte{}, base...), "metrics:\n"...),
	} {
		out, err := SetMetricPattern(in, pat)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res := Validate("gpupass.yaml", out)
		if res.Spec == nil || res.Spec.Metrics.Pattern != pat {
			t.Fatalf("%s: pattern not set:\n%s", name, out)
		}
		if got := fingerprintBytes(t, out); got != want {
			t.Errorf("%s: fingerprint %s, want %s (metrics is not part of it)", name, got, want)
		}
	}
}

func fingerprintBytes(t *testing.T, b []byte) string {
	t.Helper()
	res := Validate("gpupass.yaml", b)
	if res.Fingerprint == "" {
		t.Fatalf("no fingerprint: %+v", res.Findings)
	}
	return res.Fingerprint
}
