package spec_test

import (
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/spec"
)

// TestPinMatches is the one PEP 440 "==" rule, with the cases of issue #19
// (a CUDA local label, release padding) and PEP 440's own examples from
// "Version matching" and "Local version identifiers".
func TestPinMatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pin, installed string
		want           bool
		err            string // substring of the error, "" for none
	}{
		// Issue #19: validate --local reported these as mismatches.
		{pin: "2.4.0", installed: "2.4.0+cu121", want: true},
		{pin: "1.26", installed: "1.26.0", want: true},
		{pin: "1.26.0", installed: "1.26", want: true},
		{pin: "2.4.0", installed: "2.4.1+cu121", want: false},
		{pin: "1.26", installed: "1.26.4", want: false},
		// PEP 440 "Version matching": zero padding of the release segment.
		{pin: "1.1.0", installed: "1.1", want: true},
		{pin: "1.1", installed: "1.1.0.0", want: true},
		{pin: "1.1.post1", installed: "1.1.post1", want: true},
		{pin: "1.1", installed: "1.1.post1", want: false},
		{pin: "1.1.post1", installed: "1.1", want: false},
		// Local labels: ignored by a public pin, strict equality otherwise
		// (after normalisation of separators and case).
		{pin: "1.1", installed: "1.1+local.7", want: true},
		{pin: "2.1.0+cu121", installed: "2.1.0+cu121", want: true},
		{pin: "2.1.0+CU121", installed: "2.1.0+cu121", want: true},
		{pin: "1.0+ubuntu-1", installed: "1.0+ubuntu.1", want: true},
		{pin: "2.1.0+cu121", installed: "2.1.0+cu118", want: false},
		{pin: "2.1.0+cu121", installed: "2.1.0", want: false},
		// Epochs.
		{pin: "1!1.0", installed: "1!1.0.0", want: true},
		{pin: "1!1.0", installed: "1.0", want: false},
		{pin: "1.0", installed: "0!1.0", want: true},
		// Pre-, post- and dev-releases, with PEP 440's normal forms.
		{pin: "1.0rc1", installed: "1.0.0rc1", want: true},
		{pin: "1.0rc1", installed: "1.0c1", want: true},
		{pin: "1.0a1", installed: "1.0alpha1", want: true},
		{pin: "1.0b2", installed: "1.0-beta.2", want: true},
		{pin: "1.0rc1", installed: "1.0", want: false},
		{pin: "1.0", installed: "1.0rc1", want: false},
		{pin: "1.0.post1", installed: "1.0-1", want: true},
		{pin: "1.0.post0", installed: "1.0.post", want: true},
		{pin: "1.0.dev0", installed: "1.0dev", want: true},
		{pin: "1.0.dev1", installed: "1.0", want: false},
		{pin: "1.0a1.dev1", installed: "1.0a1", want: false},
		{pin: "V1.0", installed: "1.0", want: true},
		{pin: " 4.38.2 ", installed: "4.38.2", want: true},
		// Not versions: an error, never a string compare.
		{pin: "2.4.*", installed: "2.4.0", err: "wildcard"},
		{pin: "latest", installed: "latest", err: "pinned version"},
		{pin: "1.0", installed: "", err: "installed version"},
		{pin: "1.0", installed: "1.0-foo", err: "installed version"},
		{pin: "1.0", installed: strings.Repeat("1.", 80) + "0", err: "longer than"},
	}
	for _, tt := range tests {
		got, err := spec.PinMatches(tt.pin, tt.installed)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("PinMatches(%q, %q) error = %v, want one saying %q", tt.pin, tt.installed, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("PinMatches(%q, %q): %v", tt.pin, tt.installed, err)
		case got != tt.want:
			t.Errorf("PinMatches(%q, %q) = %v, want %v", tt.pin, tt.installed, got, tt.want)
		}
	}
}
