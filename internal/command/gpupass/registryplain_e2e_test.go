//go:build e2e

package gpupass

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// TestBundlePlainHTTPRegistryE2E points the built gpupass at a real
// plain-HTTP registry on loopback without --plain-http, as a newcomer
// following a local-registry guide does (issue #32, item 10). Each bundle
// command says once, in one line, what to add, instead of two raw Go
// errors per blob (the HTTPS try and ggcr's plain-HTTP fallback that
// gpupass refuses), and exits 2: how it was called, not a finding.
func TestBundlePlainHTTPRegistryE2E(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	dir := t.TempDir()
	house := filepath.Join(dir, "house")
	if err := os.Mkdir(house, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if _, err := wheeltest.Simple(house, n, "1.0"); err != nil {
			t.Fatal(err)
		}
	}
	gp := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GITHUB_ACTIONS=", "GITLAB_CI="}
		return testutil.Run(t, cmd)
	}
	ref := host + "/team/wheels:v1"
	// The bundle exists, pushed as the README says for a test registry.
	if out, errOut, code := gp("bundle", "push", "--plain-http", "--no-cache", "-w", house, ref); code != ExitOK {
		t.Fatalf("push with --plain-http: exit %d\n%s%s", code, out, errOut)
	}
	const want = "the registry " + "%s speaks plain HTTP: add --plain-http"
	for _, args := range [][]string{
		{"bundle", "push", "--no-cache", "-w", house, host + "/team/wheels:v2"},
		{"bundle", "pull", "--to", filepath.Join(dir, "pulled"), ref},
		{"bundle", "inspect", ref},
	} {
		t.Run(args[1], func(t *testing.T) {
			out, errOut, code := gp(args...)
			if code != ExitUsage {
				t.Errorf("exit %d, want %d\n%s%s", code, ExitUsage, out, errOut)
			}
			line := strings.Replace(want, "%s", host, 1)
			if n := strings.Count(errOut, line); n != 1 {
				t.Errorf("stderr says %q %d times, want once:\n%s", line, n, errOut)
			}
			if strings.Contains(errOut, "server gave HTTP response to HTTPS client") || strings.Contains(errOut, "http://"+host) {
				t.Errorf("stderr has Go's raw transport errors:\n%s", errOut)
			}
			if lines := strings.Count(strings.TrimSpace(errOut), "\n") + 1; lines > 1 {
				t.Errorf("stderr is %d lines, want one:\n%s", lines, errOut)
			}
		})
	}
}

// TestBundleHelpTextsE2E: a flag's help describes the command it is shown
// for (issue #32, item 10): --registry-timeout bounds a pull's waits, so
// push and inspect do not list it, and still accept it with a note.
func TestBundleHelpTextsE2E(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	help := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := testutil.Run(t, exec.Command(bin, append(args, "--help")...))
		if code != ExitOK {
			t.Fatalf("%v --help: exit %d\n%s", args, code, stderr)
		}
		return stdout
	}
	for _, cmd := range []string{"push", "inspect"} {
		if h := help("bundle", cmd); strings.Contains(h, "registry-timeout") || strings.Contains(h, "on a pull") {
			t.Errorf("bundle %s --help describes a pull:\n%s", cmd, h)
		}
	}
	if h := help("bundle", "pull"); !strings.Contains(h, "--registry-timeout duration   longest wait of a pull for the registry's response headers") {
		t.Errorf("bundle pull --help lacks --registry-timeout:\n%s", h)
	}
}
