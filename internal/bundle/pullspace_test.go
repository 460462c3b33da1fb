package bundle_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupass/gpupass/internal/bundle"
)

// pushDeclared pushes a manifest with one wheel layer that declares size
// bytes; the blob itself is never uploaded.
func pushDeclared(t *testing.T, ref string, size int64) v1.Hash {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	d := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	putManifest(t, r, []v1.Descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar", Size: size, Digest: d,
		Annotations: map[string]string{bundle.AnnotationTitle: "demo-1.0-py3-none-any.whl"}}})
	return d
}

// TestPullReservesNoDiskOnTheManifestsWord: a layer the manifest says is
// 2 GiB, sent chunked (no Content-Length), takes no more disk than the
// bytes that came; the manifest alone must not reserve space.
func TestPullReservesNoDiskOnTheManifestsWord(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t)
	ref := reg.Host + "/team/wheels:v1"
	d := pushDeclared(t, ref, 2<<30)
	parent := t.TempDir()
	var allocated atomic.Int64
	reg.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
			return false
		}
		w.WriteHeader(http.StatusOK) // chunked: no Content-Length
		w.Write([]byte("PK\x03\x04"))
		w.(http.Flusher).Flush()
		// The staged file appears as the download starts; watch its
		// allocation for a while (the 4 bytes stay in the puller's
		// buffer meanwhile).
		deadline := time.Now().Add(5 * time.Second)
		var seen time.Time
		for time.Now().Before(deadline) && (seen.IsZero() || time.Since(seen) < 300*time.Millisecond) {
			staged, _ := filepath.Glob(filepath.Join(parent, ".house.partial-*", "*.whl"))
			var st syscall.Stat_t
			if len(staged) > 0 && syscall.Stat(staged[0], &st) == nil {
				if seen.IsZero() {
					seen = time.Now()
				}
				allocated.Store(max(allocated.Load(), st.Blocks*512))
			}
			time.Sleep(5 * time.Millisecond)
		}
		if seen.IsZero() {
			allocated.Store(-1)
		}
		return true
	})
	_, err := bundle.Pull(context.Background(), ref, filepath.Join(parent, "house"), bundle.PullOptions{Registry: regOpts()})
	if err == nil {
		t.Fatal("a truncated blob was pulled")
	}
	if a := allocated.Load(); a < 0 || a > 1<<20 {
		t.Errorf("the staged wheel held %d bytes of disk before its first bytes were written (-1: never seen)", a)
	}
	assertNoPull(t, filepath.Join(parent, "house"))
}

// TestPullRefusesWhatDoesNotFit: a bundle larger than the free space of
// the target's filesystem is refused before any wheel is downloaded, and
// the error says how much is needed and free.
func TestPullRefusesWhatDoesNotFit(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t)
	ref := reg.Host + "/team/wheels:v1"
	d := pushDeclared(t, ref, 1<<50)
	var gets atomic.Int32
	reg.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
			gets.Add(1)
		}
		return false
	})
	dst := filepath.Join(t.TempDir(), "house")
	_, err := bundle.Pull(context.Background(), ref, dst, bundle.PullOptions{Registry: regOpts()})
	if err == nil || !strings.Contains(err.Error(), "take 1048576.0 GiB") || !strings.Contains(err.Error(), "free") {
		t.Fatalf("pull of a 1 PiB bundle: %v, want a free-space refusal", err)
	}
	if gets.Load() != 0 {
		t.Errorf("%d downloads started before the refusal", gets.Load())
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("target exists after a refused pull: %v", err)
	}
}
