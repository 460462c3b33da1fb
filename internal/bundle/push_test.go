package bundle_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

func TestPushPullRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	src := wheelhouse(t, 5)
	wheels := scan(t, src)
	ref := reg.Host + "/team/wheels:v1"
	res, err := bundle.Push(ctx, ref, wheels, bundle.PushOptions{Registry: regOpts(), Fingerprint: "sha256:abc", Python: "3.10.12", Source: "https://example.test/repo"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Reference, reg.Host+"/team/wheels@sha256:") || res.BlobsUploaded != 5 || res.BlobsSkipped != 0 {
		t.Fatalf("push result = %+v", res)
	}

	// The manifest is an OCI 1.1 artifact as the issue describes it.
	r, _ := name.ParseReference(res.Reference, name.Insecure)
	desc, err := remote.Get(r)
	if err != nil {
		t.Fatal(err)
	}
	var m v1.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	if m.ArtifactType != bundle.ArtifactType || m.Config.MediaType != bundle.EmptyMediaType || m.Config.Size != 2 ||
		m.Config.Digest.String() != "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" {
		t.Errorf("manifest header = artifactType %q config %+v", m.ArtifactType, m.Config)
	}
	var titles []string
	for _, l := range m.Layers {
		titles = append(titles, l.Annotations[bundle.AnnotationTitle])
	}
	want := []string{"pkg0-1.0-py3-none-any.whl", "pkg1-1.0-py3-none-any.whl", "pkg2-1.0-py3-none-any.whl", "pkg3-1.0-py3-none-any.whl", "pkg4-1.0-py3-none-any.whl", bundle.LockFile}
	if diff := cmp.Diff(want, titles); diff != "" {
		t.Errorf("layer titles (-want +got):\n%s", diff)
	}
	for _, k := range []string{bundle.AnnotationCreated, bundle.AnnotationFingerprint, bundle.AnnotationSource} {
		if m.Annotations[k] == "" {
			t.Errorf("annotation %s missing: %v", k, m.Annotations)
		}
	}

	info, err := bundle.Inspect(ctx, ref, bundle.PullOptions{Registry: regOpts()})
	if err != nil {
		t.Fatal(err)
	}
	if info.Lock == nil || len(info.Lock.Wheels) != 5 || info.Lock.Fingerprint != "sha256:abc" || info.Digest != res.Digest {
		t.Errorf("inspect = %+v", info)
	}

	if _, err := bundle.Pull(ctx, ref, filepath.Join(t.TempDir(), "w"), bundle.PullOptions{Registry: regOpts(), RequireDigest: true}); err == nil || !strings.Contains(err.Error(), "by digest") {
		t.Errorf("pull by tag with RequireDigest: %v", err)
	}

	// Pull by tag and by digest; the files are byte-identical.
	for _, pullRef := range []string{ref, res.Reference} {
		dst := filepath.Join(t.TempDir(), "wheelhouse")
		pr, err := bundle.Pull(ctx, pullRef, dst, bundle.PullOptions{Registry: regOpts()})
		if err != nil {
			t.Fatalf("pull %s: %v", pullRef, err)
		}
		if pr.Digest != res.Digest || len(pr.Wheels) != 5 {
			t.Errorf("pull result = %+v", pr)
		}
		for _, w := range wheels {
			a, _ := os.ReadFile(filepath.Join(src, w.File))
			b, err := os.ReadFile(filepath.Join(dst, w.File))
			if err != nil || string(a) != string(b) {
				t.Errorf("%s differs after pull (err=%v)", w.File, err)
			}
		}
		if _, err := os.Stat(filepath.Join(dst, bundle.LockFile)); err != nil {
			t.Errorf("lock not written: %v", err)
		}
		// A pulled wheelhouse scans clean (the lock file is allowed).
		if got := scan(t, dst); len(got) != 5 {
			t.Errorf("rescan found %d wheels", len(got))
		}
	}
}

func TestRepushSendsNoLayerBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	wheels := scan(t, wheelhouse(t, 4))
	ref := reg.Host + "/team/wheels:v1"
	if _, err := bundle.Push(ctx, ref, wheels, bundle.PushOptions{Registry: regOpts()}); err != nil {
		t.Fatal(err)
	}
	first := reg.blobBytes.Load()
	if first == 0 {
		t.Fatal("first push sent no blob bytes")
	}
	res, err := bundle.Push(ctx, reg.Host+"/team/wheels:v2", wheels, bundle.PushOptions{Registry: regOpts()})
	if err != nil {
		t.Fatal(err)
	}
	if got := reg.blobBytes.Load() - first; got != 0 || res.LayerBytesSent != 0 || res.BlobsSkipped != 4 {
		t.Errorf("re-push sent %d blob bytes on the wire, result %+v; want 0 and 4 skipped", got, res)
	}
}

func TestInterruptedPushResumesAndNeverTags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	wheels := scan(t, wheelhouse(t, 4))
	victim := wheels[2]
	// The registry fails every upload of one wheel's blob, as a dropped
	// connection halfway through a push would.
	reg.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPut && strings.Contains(r.URL.RawQuery, victim.SHA256) {
			http.Error(w, "boom", http.StatusInternalServerError)
			return true
		}
		return false
	})
	ref := reg.Host + "/team/wheels:v1"
	_, err := bundle.Push(ctx, ref, wheels, bundle.PushOptions{Registry: regOpts()})
	if err == nil || !strings.Contains(err.Error(), victim.File) {
		t.Fatalf("push error = %v, want it to name %s", err, victim.File)
	}
	r, _ := name.ParseReference(ref, name.Insecure)
	if _, err := remote.Head(r); err == nil {
		t.Fatal("the tag exists after a failed push")
	}
	reg.setFault(nil)
	before := reg.blobBytes.Load()
	res, err := bundle.Push(ctx, ref, wheels, bundle.PushOptions{Registry: regOpts()})
	if err != nil {
		t.Fatal(err)
	}
	if res.BlobsUploaded != 1 || res.LayerBytesSent != victim.Size {
		t.Errorf("resumed push uploaded %d blobs, %d bytes; want 1 blob of %d bytes", res.BlobsUploaded, res.LayerBytesSent, victim.Size)
	}
	// On the wire: the missing wheel, plus the lock and the config, which
	// go only after every wheel made it.
	if got := reg.blobBytes.Load() - before; got < victim.Size || got > victim.Size+4096 {
		t.Errorf("resumed push sent %d bytes on the wire, want %d plus the lock", got, victim.Size)
	}
}

func TestCrossRepositoryMount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	wheels := scan(t, wheelhouse(t, 3))
	if _, err := bundle.Push(ctx, reg.Host+"/team-a/wheels:v1", wheels, bundle.PushOptions{Registry: regOpts()}); err != nil {
		t.Fatal(err)
	}
	// pkg/registry keeps one blob store for all repositories and does
	// not implement mounting: deny team-b's blobs so the push must ask to
	// mount them, and answer mount requests as distribution does (201).
	// The e2e test runs the same against the real registry server.
	reg.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/team-b/wheels/blobs/") {
			w.WriteHeader(http.StatusNotFound)
			return true
		}
		if q := r.URL.Query(); r.Method == http.MethodPost && q.Get("mount") != "" && q.Get("from") == "team-a/wheels" {
			reg.mounts.Add(1)
			w.Header().Set("Location", "/v2/team-b/wheels/blobs/"+q.Get("mount"))
			w.WriteHeader(http.StatusCreated)
			return true
		}
		return false
	})
	before := reg.blobBytes.Load()
	res, err := bundle.Push(ctx, reg.Host+"/team-b/wheels:v1", wheels, bundle.PushOptions{Registry: regOpts(), MountFrom: reg.Host + "/team-a/wheels"})
	if err != nil {
		t.Fatal(err)
	}
	if got := reg.blobBytes.Load() - before; got != 0 || res.LayerBytesSent != 0 {
		t.Errorf("mounting push sent %d bytes (result %d), want 0", got, res.LayerBytesSent)
	}
	reg.setFault(nil)
	if reg.mounts.Load() < 3 {
		t.Errorf("%d mount requests, want at least 3", reg.mounts.Load())
	}
	if _, err := bundle.Pull(ctx, reg.Host+"/team-b/wheels:v1", filepath.Join(t.TempDir(), "w"), bundle.PullOptions{Registry: regOpts()}); err != nil {
		t.Fatalf("pull of the mounted bundle: %v", err)
	}
	if _, err := bundle.Push(ctx, reg.Host+"/team-b/wheels:v1", wheels, bundle.PushOptions{Registry: regOpts(), MountFrom: "elsewhere.test/x"}); err == nil {
		t.Error("mount from another registry was accepted")
	}
}

func TestPushChecksListedWheels(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	dir := wheelhouse(t, 3)
	if _, err := wheeltest.Write(dir, "liar-1.0-py3-none-any.whl", "liar", "1.0",
		[]wheeltest.File{{Name: "liar/x.py", Data: strings.NewReader("x")}}, wheeltest.Options{LieAbout: "liar/x.py"}); err != nil {
		t.Fatal(err)
	}
	listed, err := bundle.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/team/wheels:v1"
	_, err = bundle.Push(ctx, ref, listed, bundle.PushOptions{Registry: regOpts()})
	var we *bundle.WheelhouseError
	if !errors.As(err, &we) || !strings.Contains(err.Error(), "liar-1.0-py3-none-any.whl") {
		t.Fatalf("push of a wheelhouse with a lying RECORD: %v", err)
	}
	r, _ := name.ParseReference(ref, name.Insecure)
	if _, err := remote.Head(r); err == nil {
		t.Fatal("the tag exists after a refused push")
	}
	os.Remove(filepath.Join(dir, "liar-1.0-py3-none-any.whl"))
	listed, err = bundle.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	res, err := bundle.Push(ctx, ref, listed, bundle.PushOptions{Registry: regOpts()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Wheels) != 3 || res.Wheels[0].SHA256 == "" {
		t.Errorf("push of listed wheels: %+v", res.Wheels)
	}
	if _, err := bundle.Pull(ctx, ref, filepath.Join(t.TempDir(), "w"), bundle.PullOptions{Registry: regOpts()}); err != nil {
		t.Fatal(err)
	}
}
