// Package regtest gives tests the real pieces of the wheel-bundle and
// model paths: the distribution registry server (Debian's docker-registry,
// installed by scripts/setup.d/30-registry.sh, without the OCI 1.1
// referrers API) and go-containerregistry's in-process registry (with it)
// on loopback ports, and real wheels built offline by pip. The bundle and
// model end-to-end tests and the agent's bundle-install tests share it, so
// there is one way to stand them up.
package regtest

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/gpupass/gpupass/internal/testutil"
)

// StartRegistry runs the registry on a free loopback port with its
// storage in a temp dir until the test ends, and returns host:port
// (plain HTTP).
func StartRegistry(t testing.TB) string {
	t.Helper()
	addr, _ := StartRegistryStorage(t)
	return addr
}

// StartRegistryStorage is StartRegistry that also returns the root of the
// registry's filesystem storage, for tests that change what it stores
// (blobs are under docker/registry/v2/blobs/sha256/XX/HEX/data).
func StartRegistryStorage(t testing.TB) (addr, storage string) {
	t.Helper()
	bin := os.Getenv("GPUPASS_TEST_REGISTRY_BIN")
	if bin == "" {
		bin = testutil.Tool(t, "docker-registry")
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close()
	storage = filepath.Join(dir, "data")
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr, storage
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry on %s did not come up: %v\n%s", addr, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SystemPython is Debian's python3, the one with pip, setuptools and
// wheel (the first python3 on PATH may lack them).
func SystemPython(t testing.TB) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import setuptools, wheel, pip").Run(); err != nil {
		testutil.Missing(t, "%s with pip, setuptools and wheel: %v", py, err)
	}
	return py
}

// BuildWheels writes tiny packages (name -> version; module gp_alpha for
// gp-alpha, whose hello() returns "gp-alpha 1.0.0") and builds them into
// a new wheelhouse with pip, offline. It returns the wheelhouse.
func BuildWheels(t testing.TB, py string, pkgs map[string]string) string {
	t.Helper()
	src := t.TempDir()
	house := t.TempDir()
	args := []string{"-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--disable-pip-version-check", "-q", "-w", house}
	for name, version := range pkgs {
		mod := strings.ReplaceAll(name, "-", "_")
		d := filepath.Join(src, name)
		write := func(p, body string) {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(filepath.Join(d, "pyproject.toml"), fmt.Sprintf(
			"[build-system]\nrequires = [\"setuptools\"]\nbuild-backend = \"setuptools.build_meta\"\n[project]\nname = %q\nversion = %q\n", name, version))
		write(filepath.Join(d, mod, "__init__.py"), fmt.Sprintf("def hello():\n    return %q\n", name+" "+version))
		args = append(args, d)
	}
	cmd := exec.Command(py, args...)
	cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_CACHE_DIR="+filepath.Join(src, ".cache"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip wheel: %v\n%s", err, out)
	}
	return house
}

// StartInProcessRegistry runs go-containerregistry's in-process registry
// on a loopback port until the test ends, and returns host:port (plain
// HTTP). With referrers it has the OCI 1.1 referrers API, which the
// distribution registry of StartRegistry has not. wrap, when set, wraps
// the registry's handler (a registry whose storage changed, a fault).
func StartInProcessRegistry(t testing.TB, referrers bool, wrap func(next http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.WithReferrersSupport(referrers), registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
