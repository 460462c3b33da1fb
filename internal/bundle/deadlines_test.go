package bundle_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/bundle"
)

// TestPullStalledRegistry: a registry that answers the ping, then stalls
// (no headers for the manifest, or headers and then no body) fails the
// pull with a TimeoutError naming it (issue #16, finding 8).
func TestPullStalledRegistry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, what string
		stall      func(w http.ResponseWriter)
	}{
		{"no headers", "response headers", func(http.ResponseWriter) {}},
		{"body stalls", "the next bytes of a response", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Write([]byte(`{"schemaVersion":`))
			w.(http.Flusher).Flush()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.Contains(r.URL.Path, "/manifests/") {
					return // the /v2/ ping: 200
				}
				tc.stall(w)
				<-release
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(release) })
			host := strings.TrimPrefix(srv.URL, "http://")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := bundle.Pull(ctx, host+"/ml/wheels:v1", filepath.Join(t.TempDir(), "w"), bundle.PullOptions{
				Registry: bundle.RegistryOptions{PlainHTTP: true, HeaderTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}})
			var te *bundle.TimeoutError
			if !errors.As(err, &te) || te.Registry != host || te.What != tc.what || !strings.Contains(err.Error(), "registry "+host) {
				t.Fatalf("Pull: %v; want a TimeoutError naming %s and %q", err, host, tc.what)
			}
		})
	}
}
