package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestWarnInsecureHTTP: every way the agent starts (Run, and the Slurm
// and Kubernetes executors' cluster agents) warns when --insecure-http
// lets its token cross a network unencrypted, and only then.
func TestWarnInsecureHTTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url      string
		insecure bool
		warn     bool
	}{
		{"http://198.18.0.2:7070", true, true},
		{"http://broker.internal:7070", true, true},
		{"http://127.0.0.1:7070,http://10.0.0.5:7070", true, true},
		{"http://127.0.0.1:7070", true, false},
		{"https://broker.internal:7070", true, false},
		{"http://198.18.0.2:7070", false, false}, // refused at dial instead
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		o := &Options{BrokerURL: tt.url, InsecureHTTP: tt.insecure}
		o.warnInsecureHTTP(slog.New(slog.NewTextHandler(&buf, nil)))
		if got := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "--insecure-http"); got != tt.warn {
			t.Errorf("%s, --insecure-http=%v: warned %v, want %v:\n%s", tt.url, tt.insecure, got, tt.warn, buf.String())
		}
	}
}
