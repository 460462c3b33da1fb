package coremeta

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		want     map[string]string
	}{
		{"name and version", "Metadata-Version: 2.1\r\nName: torch\r\nVersion: 2.3.1\r\n", map[string]string{"Metadata-Version": "2.1", "Name": "torch", "Version": "2.3.1"}},
		{"first value wins, continuation skipped", "Name: a\nClassifier: x\n  more\nName: b\n", map[string]string{"Name": "a", "Classifier": "x"}},
		{"stops at the description", "Name: a\n\nVersion: 9\n", map[string]string{"Name": "a"}},
		{"lines without a colon skipped", "junk\nVersion: 1\n", map[string]string{"Version": "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, Headers([]byte(tt.in))); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
		})
	}
}
