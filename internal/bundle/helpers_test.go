package bundle_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// testRegistry is go-containerregistry's in-memory registry behind an
// httptest server, with a hook to inject faults and counters of what
// clients sent.
type testRegistry struct {
	srv  *httptest.Server
	Host string

	mu    sync.Mutex
	fault func(w http.ResponseWriter, r *http.Request) bool

	blobBytes atomic.Int64 // request body bytes of blob uploads
	mounts    atomic.Int64 // upload requests asking to mount
}

func newRegistry(t *testing.T, opts ...registry.Option) *testRegistry {
	t.Helper()
	tr := &testRegistry{}
	reg := registry.New(append([]registry.Option{registry.Logger(nopLogger())}, opts...)...)
	tr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.mu.Lock()
		fault := tr.fault
		tr.mu.Unlock()
		if fault != nil && fault(w, r) {
			return
		}
		if strings.Contains(r.URL.Path, "/blobs/uploads/") {
			if r.URL.Query().Get("mount") != "" {
				tr.mounts.Add(1)
			}
			r.Body = countingBody{r.Body, &tr.blobBytes}
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(tr.srv.Close)
	tr.Host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

func (tr *testRegistry) setFault(f func(w http.ResponseWriter, r *http.Request) bool) {
	tr.mu.Lock()
	tr.fault = f
	tr.mu.Unlock()
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func regOpts() bundle.RegistryOptions {
	return bundle.RegistryOptions{PlainHTTP: true, Jobs: 3, Retry: remote.Backoff{Duration: 1, Factor: 1, Steps: 1}}
}

// wheelhouse writes n small valid wheels (pkgN 1.0) with some random
// bytes so that digests differ between test runs.
func wheelhouse(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		data := make([]byte, 4096+i)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		dist := fmt.Sprintf("pkg%d", i)
		_, err := wheeltest.Write(dir, dist+"-1.0-py3-none-any.whl", dist, "1.0",
			[]wheeltest.File{{Name: dist + "/__init__.py", Data: strings.NewReader("x = 1\n")}, {Name: dist + "/data.bin", Data: strings.NewReader(string(data))}},
			wheeltest.Options{})
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func scan(t *testing.T, dir string) []bundle.Wheel {
	t.Helper()
	ws, err := bundle.Scan(context.Background(), dir, bundle.ScanOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// assertNoPull checks that a failed pull left neither the target nor a
// staging directory behind.
func assertNoPull(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s exists after a failed pull (err=%v)", dir, err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".*partial*"))
	if len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}
}

func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }

func registryHandler() http.Handler { return registry.New(registry.Logger(nopLogger())) }

type emptyKeychain struct{}

func (emptyKeychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return authn.Anonymous, nil
}
