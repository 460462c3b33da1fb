package bundle_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// TestPushFaults: whatever the registry does to a push — refuses it,
// fails, drops the connection in the middle of a blob — the error names
// the wheel and its blob, no tag points at an incomplete artifact, and a
// push once the registry is well again completes.
func TestPushFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wheels := scan(t, wheelhouse(t, 3))
	onUpload := func(method string, code int) func(w http.ResponseWriter, r *http.Request) bool {
		return func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != method || !strings.Contains(r.URL.Path, "/blobs/uploads/") {
				return false
			}
			return status(code, "/blobs/")(w, r)
		}
	}
	tests := []struct {
		name    string
		fault   func(w http.ResponseWriter, r *http.Request) bool
		wantErr []string
	}{
		{"401 on upload", onUpload(http.MethodPost, http.StatusUnauthorized), []string{"HTTP 401", "docker login", "(blob sha256:"}},
		{"403 on upload", onUpload(http.MethodPost, http.StatusForbidden), []string{"HTTP 403", "(blob sha256:"}},
		{"404 repository", onUpload(http.MethodPost, http.StatusNotFound), []string{"HTTP 404", "(blob sha256:"}},
		{"500 on the blob's body", onUpload(http.MethodPatch, http.StatusInternalServerError), []string{"HTTP 500", "(blob sha256:"}},
		{"connection dropped mid-blob", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodPatch {
				return false
			}
			// Take part of the body, then hang up.
			io.CopyN(io.Discard, r.Body, 512)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return true
		}, []string{"uploading", "(blob sha256:", "nothing was tagged"}},
		{"500 on the manifest", status(http.StatusInternalServerError, "/manifests/"), []string{"writing the manifest", "HTTP 500"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := newRegistry(t)
			reg.setFault(tt.fault)
			ref := reg.Host + "/team/wheels:v1"
			_, err := bundle.Push(ctx, ref, wheels, bundle.PushOptions{Registry: regOpts()})
			if err == nil {
				t.Fatal("push succeeded")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), "writing the manifest") && !strings.Contains(err.Error(), ".whl") {
				t.Errorf("error %q names no wheel", err)
			}
			r, _ := name.ParseReference(ref, name.Insecure)
			if _, err := remote.Head(r); err == nil {
				t.Fatal("the tag exists after a failed push")
			}
			reg.setFault(nil)
			res, err := bundle.Push(ctx, ref, wheels, bundle.PushOptions{Registry: regOpts()})
			if err != nil {
				t.Fatalf("push after the fault: %v", err)
			}
			if _, err := bundle.Pull(ctx, res.Reference, filepath.Join(t.TempDir(), "w"), bundle.PullOptions{Registry: regOpts(), RequireDigest: true}); err != nil {
				t.Errorf("pull of the completed push: %v", err)
			}
		})
	}
}

// TestPullRefusesALyingLock: the lock layer is part of what a digest
// pins; one that disagrees with the manifest's layers is refused before
// any wheel is written.
func TestPullRefusesALyingLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	dir := t.TempDir()
	good, err := wheeltest.Simple(dir, "demo", "1.0")
	if err != nil {
		t.Fatal(err)
	}
	goodBytes, _ := os.ReadFile(good)
	wheelLayer := static.NewLayer(goodBytes, bundle.WheelMediaType)
	wd, _ := wheelLayer.Digest()
	other := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		lock    bundle.Lock
		wantErr string
	}{
		{"other digest", bundle.Lock{SchemaVersion: 1, Wheels: []bundle.Wheel{{File: "demo-1.0-py3-none-any.whl", SHA256: other, Size: int64(len(goodBytes))}}}, "lock says sha256:" + other},
		{"wheel missing", bundle.Lock{SchemaVersion: 1, Wheels: []bundle.Wheel{}}, "lock lists 0 wheels, the manifest 1"},
		{"another wheel", bundle.Lock{SchemaVersion: 1, Wheels: []bundle.Wheel{{File: "evil-1.0-py3-none-any.whl", SHA256: wd.Hex, Size: int64(len(goodBytes))}}}, "wheel demo-1.0-py3-none-any.whl is not in the lock"},
		{"future schema", bundle.Lock{SchemaVersion: 2}, "schemaVersion 2"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lockBytes, _ := json.Marshal(tt.lock)
			ref := reg.Host + "/lying/lock:" + string(rune('a'+i))
			r, err := name.ParseReference(ref, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			lockLayer := static.NewLayer(lockBytes, bundle.LockMediaType)
			config := static.NewLayer([]byte(bundle.EmptyConfig), bundle.EmptyMediaType)
			m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: bundle.ArtifactType}
			for _, l := range []v1.Layer{config, wheelLayer, lockLayer} {
				if err := remote.WriteLayer(r.Context(), l); err != nil {
					t.Fatal(err)
				}
			}
			cd, _ := config.Digest()
			ld, _ := lockLayer.Digest()
			m.Config = v1.Descriptor{MediaType: bundle.EmptyMediaType, Size: 2, Digest: cd}
			m.Layers = []v1.Descriptor{
				{MediaType: bundle.WheelMediaType, Size: int64(len(goodBytes)), Digest: wd, Annotations: map[string]string{bundle.AnnotationTitle: "demo-1.0-py3-none-any.whl"}},
				{MediaType: bundle.LockMediaType, Size: int64(len(lockBytes)), Digest: ld, Annotations: map[string]string{bundle.AnnotationTitle: bundle.LockFile}},
			}
			raw, _ := json.Marshal(m)
			if err := remote.Put(r, rawTaggable(raw)); err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(t.TempDir(), "wheelhouse")
			_, err = bundle.Pull(ctx, ref, dst, bundle.PullOptions{Registry: regOpts()})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("pull error = %v, want it to contain %q", err, tt.wantErr)
			}
			assertNoPull(t, dst)
		})
	}
}
