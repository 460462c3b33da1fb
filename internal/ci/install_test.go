package ci_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// releaseTarball is a release archive whose gpupass is a shell script
// that prints a version, so the test needs no Go build.
func releaseTarball(t *testing.T) []byte {
	t.Helper()
	script := []byte("#!/bin/sh\necho gpupass v9.9.9-test\n")
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "gpupass", Mode: 0o755, Size: int64(len(script))})
	tw.Write(script)
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// TestInstallScript runs scripts/action/install.sh against a loopback
// release server: the released binary is installed only when it matches
// the checksum file, and a missing release without Go fails with one
// annotation.
func TestInstallScript(t *testing.T) {
	t.Parallel()
	bash := testutil.Tool(t, "bash")
	testutil.Tool(t, "curl")
	testutil.Tool(t, "sha256sum")
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "action", "install.sh")
	tarball := releaseTarball(t)
	good := fmt.Sprintf("%x  gpupass_linux_amd64.tar.gz\n", sha256.Sum256(tarball))
	bad := fmt.Sprintf("%x  gpupass_linux_amd64.tar.gz\n", sha256.Sum256([]byte("something else")))

	tests := []struct {
		name      string
		checksums string
		version   string
		noRelease bool
		wantOK    bool
		wantLog   string
	}{
		{name: "matching checksum installs the release", checksums: good, version: "v9.9.9", wantOK: true, wantLog: "gpupass v9.9.9-test"},
		{name: "latest", checksums: good, version: "latest", wantOK: true, wantLog: "gpupass v9.9.9-test"},
		{name: "checksum mismatch is an error, never a fallback", checksums: bad, version: "v9.9.9", wantLog: "::error title=gpupass install::checksum mismatch"},
		{name: "no release and no Go", version: "v1.0.0", noRelease: true, wantLog: "::error title=gpupass install::no gpupass release for linux/amd64 at version v1.0.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mux := http.NewServeMux()
			var mu sync.Mutex
			var requests []string
			serve := func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				requests = append(requests, r.URL.Path)
				mu.Unlock()
				if tt.noRelease {
					http.NotFound(w, r)
					return
				}
				switch {
				case strings.HasSuffix(r.URL.Path, "/gpupass_linux_amd64.tar.gz"):
					w.Write(tarball)
				case strings.HasSuffix(r.URL.Path, "/checksums.txt"):
					w.Write([]byte(tt.checksums))
				default:
					http.NotFound(w, r)
				}
			}
			mux.HandleFunc("/acme/gpupass/releases/", serve)
			ts := httptest.NewServer(mux)
			defer ts.Close()

			tmp := t.TempDir()
			ghPath := filepath.Join(tmp, "github_path")
			// PATH without go: the source fallback must say what is missing.
			bin := filepath.Join(tmp, "bin")
			os.Mkdir(bin, 0o755)
			for _, tool := range []string{"curl", "sha256sum", "tar", "grep", "mkdir", "mktemp", "uname", "gzip", "dirname", "cat", "rm"} {
				if p, err := exec.LookPath(tool); err == nil {
					os.Symlink(p, filepath.Join(bin, tool))
				}
			}
			cmd := exec.Command(bash, script)
			cmd.Env = []string{
				"PATH=" + bin,
				"GPUPASS_INSTALL_VERSION=" + tt.version,
				"GPUPASS_ACTION_PATH=" + tmp,
				"GPUPASS_ACTION_REPOSITORY=acme/gpupass",
				"GITHUB_SERVER_URL=" + ts.URL,
				"GITHUB_PATH=" + ghPath,
				"RUNNER_OS=Linux", "RUNNER_ARCH=X64",
				"RUNNER_TEMP=" + tmp,
				"TMPDIR=" + tmp,
			}
			out, err := cmd.CombinedOutput()
			if (err == nil) != tt.wantOK {
				t.Fatalf("install.sh: err = %v, want ok %v\n%s", err, tt.wantOK, out)
			}
			if !strings.Contains(string(out), tt.wantLog) {
				t.Errorf("log lacks %q:\n%s", tt.wantLog, out)
			}
			// Self-hosted runners keep their temp dirs: the download is
			// gone however the script ended.
			if left, _ := filepath.Glob(filepath.Join(tmp, "gpupass-download*")); len(left) > 0 {
				t.Errorf("install.sh left its download behind: %v", left)
			}
			p, _ := os.ReadFile(ghPath)
			if installed := strings.TrimSpace(string(p)) == filepath.Join(tmp, "gpupass-bin"); installed != tt.wantOK {
				t.Errorf("GITHUB_PATH = %q, want the install dir: %v", p, tt.wantOK)
			}
			mu.Lock()
			defer mu.Unlock()
			if tt.version == "latest" && (len(requests) == 0 || !strings.Contains(requests[0], "/releases/latest/download/")) {
				t.Errorf("latest fetched %v", requests)
			}
		})
	}
}
