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
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/testutil"
)

// releaseTarball is a release archive whose gpupass is a shell script
// that prints version as `gpupass version` does, so the test needs no Go
// build.
func releaseTarball(t *testing.T, version string) []byte {
	t.Helper()
	script := []byte("#!/bin/sh\necho gpupass " + version + " '(commit 0123abc, 2026-12-01)'\n")
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "gpupass", Mode: 0o755, Size: int64(len(script))})
	tw.Write(script)
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// cosignKeyPair makes a cosign key pair with the real cosign CLI and
// returns a function that signs a file's bytes into a Sigstore bundle
// (the way scripts/release/sign.sh does in a dry run), and the public key.
func cosignKeyPair(t *testing.T, cosign string) (sign func(body []byte) []byte, pub string) {
	t.Helper()
	dir := t.TempDir()
	env := append(os.Environ(), "COSIGN_PASSWORD=install-test")
	kg := exec.Command(cosign, "generate-key-pair", "--output-key-prefix", "release")
	kg.Dir, kg.Env = dir, env
	if b, err := kg.CombinedOutput(); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, b)
	}
	sign = func(body []byte) []byte {
		t.Helper()
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "checksums.txt"), body, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("bash", filepath.Join(testutil.RepoRoot(t), "scripts", "release", "sign.sh"), d)
		cmd.Env = append(env, "COSIGN="+cosign, "COSIGN_KEY="+filepath.Join(dir, "release.key"))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("sign.sh: %v\n%s", err, b)
		}
		b, err := os.ReadFile(filepath.Join(d, "checksums.txt.sigstore.json"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return sign, filepath.Join(dir, "release.pub")
}

// TestInstallScript runs scripts/action/install.sh against a loopback
// release server. The released binary is installed only when checksums.txt
// verifies against its Sigstore bundle (signed here with a key pair by the
// real cosign, through scripts/release/sign.sh) and the archive matches the
// checksum inside; a tampered checksum file, a bundle signed by another
// key or a missing bundle stop the install with one annotation, never a
// fallback. A named release that is not there is an error even where Go
// could build something else (v9.9.9 used to install "gpupass dev"); so is
// another release's signed files served under the tag asked for. Only
// version: source or an unreleased action checkout builds from source, and
// the log says which.
func TestInstallScript(t *testing.T) {
	t.Parallel()
	bash := testutil.Tool(t, "bash")
	testutil.Tool(t, "curl")
	testutil.Tool(t, "sha256sum")
	cosign := testutil.Tool(t, "cosign")
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "action", "install.sh")
	tarball := releaseTarball(t, "v9.9.9")
	good := fmt.Sprintf("%x  gpupass_linux_amd64.tar.gz\n", sha256.Sum256(tarball))
	bad := fmt.Sprintf("%x  gpupass_linux_amd64.tar.gz\n", sha256.Sum256([]byte("something else")))
	sign, pub := cosignKeyPair(t, cosign)
	otherSign, _ := cosignKeyPair(t, cosign)
	goodSig, badSig, otherSig := sign([]byte(good)), sign([]byte(bad)), otherSign([]byte(good))
	// An older release, signed by the same key: its files served under
	// v9.9.9's URL.
	oldTarball := releaseTarball(t, "v9.9.8")
	oldSums := fmt.Sprintf("%x  gpupass_linux_amd64.tar.gz\n", sha256.Sum256(oldTarball))
	oldSig := sign([]byte(oldSums))

	tests := []struct {
		name       string
		checksums  string
		bundle     []byte // nil: no checksums.txt.sigstore.json in the release
		version    string
		actionFile string // scripts/action/version of the action's checkout
		noRelease  bool
		tarball    []byte // nil: the v9.9.9 one
		goInPath   bool   // a go that "builds" a gpupass printing "gpupass dev"
		env        []string
		wantOK     bool
		wantLog    string
		wantPath   string // a request the install must make
	}{
		{name: "signed checksum file and matching archive install the release", checksums: good, bundle: goodSig, version: "v9.9.9", wantOK: true, wantLog: "Verified OK"},
		{name: "latest is resolved to its tag", checksums: good, bundle: goodSig, version: "latest", wantOK: true, wantLog: "gpupass v9.9.9 (commit", wantPath: "/releases/download/v9.9.9/checksums.txt"},
		{name: "default is the action's own release", checksums: good, bundle: goodSig, actionFile: "v9.9.9\n", wantOK: true, wantLog: "gpupass v9.9.9 (commit", wantPath: "/releases/download/v9.9.9/gpupass_linux_amd64.tar.gz"},
		{name: "a named version that is not there is an error, not a source build", version: "v9.9.7", goInPath: true,
			wantLog: "::error title=gpupass install::cannot download gpupass v9.9.7 for linux/amd64: ", wantPath: "/releases/download/v9.9.7/gpupass_linux_amd64.tar.gz"},
		{name: "another release's signed files under the tag asked for", checksums: oldSums, bundle: oldSig, tarball: oldTarball, version: "v9.9.9",
			wantLog: `::error title=gpupass install::the release at `},
		{name: "a version that is not a tag", version: "main", goInPath: true, wantLog: "::error title=gpupass install::version main is not a release tag: give vX.Y.Z, latest or source"},
		{name: "a platform no release is built for is an error, not a source build", checksums: good, bundle: goodSig, version: "v9.9.9", goInPath: true, env: []string{"RUNNER_ARCH=ARM"},
			wantLog: "::error title=gpupass install::no gpupass release is built for Linux/ARM; set version: source"},
		{name: "source builds from source and says why", version: "source", goInPath: true, wantOK: true, wantLog: "building gpupass from source in "},
		{name: "checksum mismatch is an error, never a fallback", checksums: bad, bundle: badSig, version: "v9.9.9", wantLog: "::error title=gpupass install::checksum mismatch"},
		{name: "tampered checksum file", checksums: bad, bundle: goodSig, version: "v9.9.9", wantLog: "::error title=gpupass install::the signature of checksums.txt from"},
		{name: "signature by another key", checksums: good, bundle: otherSig, version: "v9.9.9", wantLog: "::error title=gpupass install::the signature of checksums.txt from"},
		{name: "tampered bundle", checksums: good, bundle: []byte(`{"base64Signature":"` + strings.Repeat("A", 96) + `"}`), version: "v9.9.9", wantLog: "::error title=gpupass install::the signature of checksums.txt from"},
		{name: "unsigned release", checksums: good, version: "v9.9.9", wantLog: "::error title=gpupass install::the release at"},
		{name: "no release and no Go", version: "v1.0.0", noRelease: true, wantLog: "::error title=gpupass install::cannot download gpupass v1.0.0 for linux/amd64"},
		{name: "unreleased action builds from source", actionFile: "dev\n", wantLog: "::error title=gpupass install::building gpupass from source because the action's checkout is not a release (scripts/action/version says dev), but Go is not installed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tb := tt.tarball
			if tb == nil {
				tb = tarball
			}
			srv, requests := releaseFiles(t, tt.noRelease, tt.checksums, tt.bundle, tb)
			tmp := t.TempDir()
			if tt.goInPath {
				fakeGo(t, tmp)
			}
			if tt.actionFile != "" {
				os.MkdirAll(filepath.Join(tmp, "scripts", "action"), 0o755)
				os.WriteFile(filepath.Join(tmp, "scripts", "action", "version"), []byte(tt.actionFile), 0o644)
			}
			out, err := runInstall(t, bash, script, tmp, srv.URL, append([]string{
				"GPUPASS_INSTALL_VERSION=" + tt.version,
				"GPUPASS_INSTALL_COSIGN=" + cosign,
				"GPUPASS_INSTALL_COSIGN_PUBLIC_KEY=" + pub}, tt.env...)...)
			if (err == nil) != tt.wantOK {
				t.Fatalf("install.sh: err = %v, want ok %v\n%s", err, tt.wantOK, out)
			}
			if !strings.Contains(out, tt.wantLog) {
				t.Errorf("log lacks %q:\n%s", tt.wantLog, out)
			}
			if !tt.wantOK && strings.Count(out, "::error") != 1 {
				t.Errorf("want exactly one error annotation:\n%s", out)
			}
			// Self-hosted runners keep their temp dirs: the download is
			// gone however the script ended.
			if left, _ := filepath.Glob(filepath.Join(tmp, "gpupass-download*")); len(left) > 0 {
				t.Errorf("install.sh left its download behind: %v", left)
			}
			p, _ := os.ReadFile(filepath.Join(tmp, "github_path"))
			if installed := strings.TrimSpace(string(p)) == filepath.Join(tmp, "gpupass-bin"); installed != tt.wantOK {
				t.Errorf("GITHUB_PATH = %q, want the install dir: %v", p, tt.wantOK)
			}
			if _, err := os.Stat(filepath.Join(tmp, "gpupass-bin", "gpupass")); (err == nil) != tt.wantOK {
				t.Errorf("gpupass installed: %v, want %v", err == nil, tt.wantOK)
			}
			if tt.wantPath != "" && !slices.ContainsFunc(requests(), func(r string) bool { return strings.Contains(r, tt.wantPath) }) {
				t.Errorf("requests %v, want one for %s", requests(), tt.wantPath)
			}
		})
	}
}

// TestInstallScriptKeylessIdentity checks the cosign command line the
// install script runs without a public key, the production default: the
// certificate must name this repository's release workflow run for the
// exact tag installed (latest: the tag it redirects to), issued by GitHub
// Actions' OIDC issuer; a signature made for any other v* tag does not
// verify. The cosign here is a stand-in that records its arguments:
// keyless verification needs Sigstore's public services.
func TestInstallScriptKeylessIdentity(t *testing.T) {
	t.Parallel()
	bash := testutil.Tool(t, "bash")
	testutil.Tool(t, "curl")
	testutil.Tool(t, "sha256sum")
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "action", "install.sh")
	tarball := releaseTarball(t, "v9.9.9")
	good := fmt.Sprintf("%x  gpupass_linux_amd64.tar.gz\n", sha256.Sum256(tarball))
	for _, version := range []string{"v9.9.9", "latest"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			srv, _ := releaseFiles(t, false, good, []byte("{}"), tarball)
			tmp := t.TempDir()
			argsFile := filepath.Join(tmp, "cosign-args")
			fake := filepath.Join(tmp, "cosign")
			if err := os.WriteFile(fake, []byte("#!/bin/sh\nprintf '%s\\n' \"$@\" >"+argsFile+"\necho Verified OK\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := runInstall(t, bash, script, tmp, srv.URL, "GPUPASS_INSTALL_VERSION="+version, "GPUPASS_INSTALL_COSIGN="+fake)
			if err != nil {
				t.Fatalf("install.sh: %v\n%s", err, out)
			}
			b, err := os.ReadFile(argsFile)
			if err != nil {
				t.Fatal(err)
			}
			args := strings.Split(strings.TrimSpace(string(b)), "\n")
			want := []string{"verify-blob",
				"--bundle", filepath.Join(filepath.Dir(args[2]), "checksums.txt.sigstore.json"),
				"--certificate-identity", "https://github.com/acme/gpupass/.github/workflows/release.yml@refs/tags/v9.9.9",
				"--certificate-oidc-issuer", "https://token.actions.githubusercontent.com",
				filepath.Join(filepath.Dir(args[2]), "checksums.txt")}
			if diff := cmp.Diff(want, args); diff != "" {
				t.Errorf("cosign arguments (-want +got):\n%s", diff)
			}
		})
	}
}

// fakeGo puts a go on the install's PATH (tmp/bin) whose build writes a
// gpupass that prints "gpupass dev", as a source build of the action's
// checkout would.
func fakeGo(t *testing.T, tmp string) {
	t.Helper()
	bin := filepath.Join(tmp, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	stub := `#!/bin/bash
out=""
while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done
printf '#!/bin/sh\necho gpupass dev\n' >"${out}gpupass"; chmod +x "${out}gpupass"
`
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
}

// releaseFiles serves one release, v9.9.9, the way GitHub does under
// /acme/gpupass/releases/… (latest redirects to its tag), and records the
// paths asked for.
func releaseFiles(t *testing.T, none bool, checksums string, bundle, tarball []byte) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var requests []string
	mux := http.NewServeMux()
	mux.HandleFunc("/acme/gpupass/releases/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.URL.Path)
		mu.Unlock()
		switch {
		case r.URL.Path == "/acme/gpupass/releases/latest" && !none:
			http.Redirect(w, r, "/acme/gpupass/releases/tag/v9.9.9", http.StatusFound)
		case none || !strings.HasPrefix(r.URL.Path, "/acme/gpupass/releases/download/v9.9.9/"):
			http.NotFound(w, r)
		case strings.HasSuffix(r.URL.Path, "/gpupass_linux_amd64.tar.gz"):
			w.Write(tarball)
		case strings.HasSuffix(r.URL.Path, "/checksums.txt"):
			w.Write([]byte(checksums))
		case strings.HasSuffix(r.URL.Path, "/checksums.txt.sigstore.json") && bundle != nil:
			w.Write(bundle)
		default:
			http.NotFound(w, r)
		}
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(requests)
	}
}

// runInstall runs install.sh as the action does, with a PATH without go
// (the source fallback must say what is missing), the action checkout at
// tmp and RUNNER_TEMP at tmp.
func runInstall(t *testing.T, bash, script, tmp, server string, env ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(tmp, "bin")
	os.Mkdir(bin, 0o755)
	for _, tool := range []string{"curl", "sha256sum", "tar", "grep", "mkdir", "mktemp", "uname", "gzip", "dirname", "cat", "rm", "tr", "cut", "chmod", "head"} {
		if p, err := exec.LookPath(tool); err == nil {
			os.Symlink(p, filepath.Join(bin, tool))
		}
	}
	cmd := exec.Command(bash, script)
	cmd.Env = append([]string{
		"PATH=" + bin,
		"HOME=" + tmp, // cosign's cache
		"GPUPASS_ACTION_PATH=" + tmp,
		"GPUPASS_ACTION_REPOSITORY=acme/gpupass",
		"GITHUB_SERVER_URL=" + server,
		"GITHUB_PATH=" + filepath.Join(tmp, "github_path"),
		"RUNNER_OS=Linux", "RUNNER_ARCH=X64",
		"RUNNER_TEMP=" + tmp,
		"TMPDIR=" + tmp,
	}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
