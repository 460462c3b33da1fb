//go:build e2e

package bundle_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
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

// TestE2EPullRecordCheck: a pull re-checks RECORD only where push did not
// (issue #19), and still refuses every blob that is not the one pushed.
// A wheel whose RECORD lies about a file but whose blob is intact is pushed
// with oras, once with a gpupass lock layer that lists its true digest (as
// no gpupass push would write: push checks RECORD) and once without:
//   - with the lock, `bundle pull` accepts it (digests and lock match; the
//     RECORD check is skipped), and --verify-record (or its environment
//     variable) refuses it, naming RECORD;
//   - without a lock (another tool pushed it), pull refuses it as it is;
//   - a gpupass-pushed bundle whose wheel blob is changed in the
//     registry's storage is refused by its digest, with the flag or not.
func TestE2EPullRecordCheck(t *testing.T) {
	t.Parallel()
	oras := testutil.Tool(t, "oras")
	host, storage := regtest.StartRegistryStorage(t)
	gp := testutil.BuildBinary(t, "./cmd/gpupass")

	dir := t.TempDir()
	const whl = "liar-1.0-py3-none-any.whl"
	text := strings.Repeat("import torch  # deflates well\n", 2000)
	p, err := wheeltest.Write(dir, whl, "liar", "1.0",
		[]wheeltest.File{{Name: "liar/__init__.py", Data: strings.NewReader(text)}}, wheeltest.Options{DeflateSized: true, LieAbout: "liar/__init__.py"})
	must(t, err)
	b, err := os.ReadFile(p)
	must(t, err)
	sum := sha256.Sum256(b)
	lock, err := json.Marshal(bundle.Lock{SchemaVersion: 1, Wheels: []bundle.Wheel{{
		File: whl, Name: "liar", Version: "1.0", Tags: []string{"py3-none-any"}, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b)),
	}}})
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, bundle.LockFile), lock, 0o644))
	orasPush := func(ref string, files ...string) {
		t.Helper()
		cmd := exec.Command(oras, append([]string{"push", "--plain-http", "--artifact-type", bundle.ArtifactType, ref}, files...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("oras push %s: %v\n%s", ref, err, out)
		}
	}
	withLock, noLock := host+"/ml/crafted:v1", host+"/ml/crafted-nolock:v1"
	orasPush(withLock, whl+":"+bundle.WheelMediaType, bundle.LockFile+":"+bundle.LockMediaType)
	orasPush(noLock, whl+":"+bundle.WheelMediaType)

	pull := func(env []string, args ...string) (string, string, error) {
		t.Helper()
		to := filepath.Join(t.TempDir(), "w")
		cmd := exec.Command(gp, append([]string{"-o", "json", "bundle", "pull", "--plain-http", "--to", to}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil {
			if entries, _ := os.ReadDir(to); len(entries) > 0 {
				t.Errorf("failed pull %v wrote %d entries to %s", args, len(entries), to)
			}
		}
		return out.String(), errb.String(), err
	}
	refused := func(what string, stderr string, err error, want string) {
		t.Helper()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("%s: %v, want exit code 1 (verification failed)\n%s", what, err, stderr)
		}
		if !strings.Contains(stderr, want) {
			t.Errorf("%s: error does not contain %q:\n%s", what, want, stderr)
		}
	}

	out, stderr, err := pull(nil, withLock)
	if err != nil {
		t.Fatalf("pull with a lock layer checked RECORD (it should trust push's check): %v\n%s", err, stderr)
	}
	var res bundle.PullResult
	must(t, json.Unmarshal([]byte(out), &res))
	if res.RecordChecked || res.Lock == nil {
		t.Errorf("pull with a lock layer: recordChecked %v, lock %v; want false and the lock", res.RecordChecked, res.Lock)
	}
	_, stderr, err = pull(nil, "--verify-record", withLock)
	refused("pull --verify-record of a lying wheel", stderr, err, "liar/__init__.py: RECORD says sha256=")
	_, stderr, err = pull([]string{"GPUPASS_VERIFY_RECORD=true"}, withLock)
	refused("pull with GPUPASS_VERIFY_RECORD=true of a lying wheel", stderr, err, "liar/__init__.py: RECORD says sha256=")
	_, stderr, err = pull(nil, noLock)
	refused("pull of a lying wheel without a lock layer", stderr, err, "liar/__init__.py: RECORD says sha256=")

	// A good bundle pushed by gpupass, one byte of its wheel's blob then
	// changed where the registry keeps it (same size).
	house := t.TempDir()
	good, err := wheeltest.Simple(house, "demo", "1.0")
	must(t, err)
	ref := host + "/ml/blob-tamper:v1"
	_, err = run(t, gp, "bundle", "push", "--plain-http", "--wheelhouse", house, ref)
	must(t, err)
	gb, err := os.ReadFile(good)
	must(t, err)
	gsum := hex.EncodeToString(func() []byte { s := sha256.Sum256(gb); return s[:] }())
	blob := filepath.Join(storage, "docker", "registry", "v2", "blobs", "sha256", gsum[:2], gsum, "data")
	raw, err := os.ReadFile(blob)
	must(t, err)
	raw[len(raw)/2] ^= 1
	must(t, os.WriteFile(blob, raw, 0o644))
	for _, args := range [][]string{{ref}, {"--verify-record", ref}} {
		_, stderr, err := pull(nil, args...)
		refused(fmt.Sprintf("pull %v of a tampered blob", args), stderr, err, "not to the manifest's digest")
	}
}
