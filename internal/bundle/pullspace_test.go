//go:build linux

package bundle_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

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
