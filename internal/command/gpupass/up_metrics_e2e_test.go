//go:build e2e

package gpupass_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestUpPrintsAMetricsCommandThatWorks pastes the metrics line `gpupass
// up` prints into a shell, as a new user would, and gets the broker's
// Prometheus text; the line names the read token's file, never the token
// (#32 item 10).
func TestUpPrintsAMetricsCommandThatWorks(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		testutil.Missing(t, "curl")
	}
	s := upstack.Start(t, upstack.Options{})
	out := s.Out.String()
	m := regexp.MustCompile(`(?m)^metrics +(curl .*?)(  \(.*)?$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("up printed no metrics line with a curl command:\n%s", out)
	}
	f := regexp.MustCompile(`\$\(cat ('[^']+'|\S+)\)`).FindStringSubmatch(m[1])
	if f == nil {
		t.Fatalf("metrics line %q does not read the token from a file", m[1])
	}
	tok, err := os.ReadFile(strings.Trim(f[1], "'"))
	if err != nil {
		t.Fatalf("the read token file the metrics line names: %v", err)
	}
	if len(strings.TrimSpace(string(tok))) < 8 || strings.Contains(out, strings.TrimSpace(string(tok))) {
		t.Errorf("up printed the read token itself, or the file holds none (%d bytes)", len(tok))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -o pipefail; "+m[1]+" --fail --silent --show-error")
	cmd.Dir = t.TempDir()
	b, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(b), "# TYPE ") || !strings.Contains(string(b), "gpupass_") {
		t.Fatalf("pasted %q: %v\n%s", m[1], err, upstack.Tail(string(b), 2000))
	}
}
