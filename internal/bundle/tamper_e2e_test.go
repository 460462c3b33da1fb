//go:build e2e

package bundle_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

// TestE2ETamperedManifestRefused: one byte of a pushed bundle's manifest
// changed in the real registry's storage (the config's mediaType, so the
// JSON still parses) must fail `gpupass bundle pull` by tag and by digest
// and write nothing, as `oras pull` refuses it (issue #16, finding 9).
func TestE2ETamperedManifestRefused(t *testing.T) {
	t.Parallel()
	py := regtest.SystemPython(t)
	host, storage := regtest.StartRegistryStorage(t)
	gp := testutil.BuildBinary(t, "./cmd/gpupass")
	house := regtest.BuildWheels(t, py, map[string]string{"gp-alpha": "1.0.0"})
	ref := host + "/ml/tamper:v1"
	out, err := run(t, gp, "-o", "json", "bundle", "push", "--plain-http", "--wheelhouse", house, ref)
	must(t, err)
	var pushed bundle.PushResult
	must(t, json.Unmarshal([]byte(out), &pushed))
	hexDigest := strings.TrimPrefix(pushed.Digest, "sha256:")
	blob := filepath.Join(storage, "docker", "registry", "v2", "blobs", "sha256", hexDigest[:2], hexDigest, "data")
	raw, err := os.ReadFile(blob)
	must(t, err)
	cfg := bytes.Index(raw, []byte(`"config"`))
	at := bytes.Index(raw[max(cfg, 0):], []byte(bundle.EmptyMediaType))
	if cfg < 0 || at < 0 {
		t.Fatalf("no config media type in the stored manifest:\n%s", raw)
	}
	i := cfg + at + strings.Index(bundle.EmptyMediaType, "empty") + 4 // "empty" -> "emptz"
	raw[i] = 'z'
	must(t, os.WriteFile(blob, raw, 0o644))

	for _, pull := range []string{ref, host + "/ml/tamper@" + pushed.Digest} {
		to := filepath.Join(t.TempDir(), "wheels")
		out, err := run(t, gp, "bundle", "pull", "--plain-http", "--to", to, pull)
		if err == nil {
			t.Fatalf("pull %s of a tampered manifest succeeded:\n%s", pull, out)
		}
		if !strings.Contains(err.Error(), "mismatched digest") || !strings.Contains(err.Error(), "verification failed") {
			t.Errorf("pull %s: error does not say the digest mismatched:\n%v", pull, err)
		}
		if entries, _ := os.ReadDir(to); len(entries) > 0 {
			t.Errorf("pull %s wrote %d entries to %s", pull, len(entries), to)
		}
	}

	// The peer tool refuses it too (it is installed in CI).
	oras, err := exec.LookPath("oras")
	if err != nil {
		if testutil.InCI() {
			t.Fatal("oras not on PATH (CI=true)")
		}
		return
	}
	if out, err := run(t, oras, "pull", "--plain-http", "-o", t.TempDir(), ref); err == nil {
		t.Errorf("oras pull %s of the tampered manifest succeeded:\n%s", ref, out)
	} else if !strings.Contains(err.Error(), "mismatch") {
		t.Logf("oras refused it with: %v", err)
	}
}

// TestE2EPullSilentRegistryTimesOut: a registry that accepts connections
// and never answers fails `gpupass bundle pull` within --registry-timeout
// with an error naming it, instead of hanging (issue #16, finding 8).
func TestE2EPullSilentRegistryTimesOut(t *testing.T) {
	t.Parallel()
	gp := testutil.BuildBinary(t, "./cmd/gpupass")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			t.Cleanup(func() { c.Close() }) // held open, never answered
		}
	}()
	host := ln.Addr().String()
	cmd := exec.Command(gp, "bundle", "pull", "--plain-http", "--registry-timeout", "1s", "--to", filepath.Join(t.TempDir(), "w"), host+"/ml/wheels:v1")
	cmd.WaitDelay = 0
	done := make(chan error, 1)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("pull from a silent registry succeeded")
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("pull from a silent registry still hanging after 2 minutes (--registry-timeout 1s); %d connections", conns.Load())
	}
	msg := stderr.String()
	if !strings.Contains(msg, "registry "+host) || !strings.Contains(msg, "sent no response headers within 1s") {
		t.Errorf("error does not name the registry and the timeout:\n%s", msg)
	}
}

// TestE2EPullEndlessManifestStopsAt4MiB: a registry that streams a
// manifest without end is cut off after about 4 MiB (the bundle limit),
// not read to go-containerregistry's 100 MB (issue #16, finding 8). The
// server counts what it managed to write; socket buffers add a few MiB.
func TestE2EPullEndlessManifestStopsAt4MiB(t *testing.T) {
	t.Parallel()
	gp := testutil.BuildBinary(t, "./cmd/gpupass")
	var written atomic.Int64
	handled := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/manifests/") {
			w.WriteHeader(http.StatusOK) // the /v2/ ping
			return
		}
		defer func() { handled <- struct{}{} }()
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		chunk := bytes.Repeat([]byte(" "), 64<<10)
		if n, err := w.Write([]byte(`{"schemaVersion":2,"annotations":{"x":"`)); err == nil {
			written.Add(int64(n))
		}
		for written.Load() < 1<<30 {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	srv.Start()
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	_, err := run(t, gp, "bundle", "pull", "--plain-http", "--to", filepath.Join(t.TempDir(), "w"), host+"/ml/wheels:v1")
	if err == nil {
		t.Fatal("pull of an endless manifest succeeded")
	}
	if !strings.Contains(err.Error(), "more than 4194304 bytes of manifest") {
		t.Errorf("error does not say the manifest is too large:\n%v", err)
	}
	select {
	case <-handled: // the handler saw the connection go
	case <-time.After(time.Minute):
		t.Fatal("the manifest handler is still writing a minute after the pull ended")
	}
	if n := written.Load(); n > 32<<20 {
		t.Errorf("the server wrote %d bytes of manifest before the pull gave up; want about 4 MiB (plus socket buffers)", n)
	} else {
		t.Logf("server wrote %d bytes before the pull stopped reading", n)
	}
}
