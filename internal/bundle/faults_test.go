package bundle_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

func TestPullFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wheels := scan(t, wheelhouse(t, 3))
	victim := wheels[1]
	blobPath := "/blobs/sha256:" + victim.SHA256
	tests := []struct {
		name    string
		tag     string
		fault   func(w http.ResponseWriter, r *http.Request) bool
		wantErr []string
	}{
		{"401", "v1", status(http.StatusUnauthorized, "/manifests/"), []string{"HTTP 401", "docker login"}},
		{"403", "v1", status(http.StatusForbidden, "/manifests/"), []string{"HTTP 403"}},
		{"404 manifest", "nope", nil, []string{"MANIFEST_UNKNOWN", "HTTP 404"}},
		{"404 blob", "v1", status(http.StatusNotFound, blobPath), []string{victim.File, victim.SHA256, "404"}},
		{"500 blob", "v1", status(http.StatusInternalServerError, blobPath), []string{victim.File, "500"}},
		{"drop mid-blob", "v1", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, blobPath) {
				return false
			}
			w.Header().Set("Content-Length", strconv.FormatInt(victim.Size, 10))
			w.WriteHeader(http.StatusOK)
			w.Write(bytes.Repeat([]byte{'x'}, 1000))
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return true
		}, []string{victim.File, "unexpected EOF"}},
		{"digest mismatch", "v1", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, blobPath) {
				return false
			}
			body := bytes.Repeat([]byte{'y'}, int(victim.Size))
			w.Write(body)
			return true
		}, []string{victim.File, "verification failed", "hash to sha256:", "not to the manifest's digest"}},
		{"wrong content-length", "v1", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, blobPath) {
				return false
			}
			w.Header().Set("Content-Length", "100000")
			w.Write(bytes.Repeat([]byte{'y'}, 100000))
			return true
		}, []string{victim.File, "Content-Length 100000", "manifest says"}},
		// Registries send blobs to storage with signed URLs; when that
		// storage fails, the error must not carry the signature.
		{"redirect to failing storage", "v1", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, blobPath) {
				return false
			}
			http.Redirect(w, r, "http://127.0.0.1:1/storage/blob?X-Amz-Signature=SECRETSIG&X-Amz-Credential=SECRETCRED", http.StatusTemporaryRedirect)
			return true
		}, []string{victim.File, "127.0.0.1:1/storage/blob", "connection refused"}},
		{"longer blob", "v1", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, blobPath) {
				return false
			}
			w.Write(bytes.Repeat([]byte{'y'}, int(victim.Size)+10))
			return true
		}, []string{victim.File, "manifest says"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Each case needs its own fault on a registry holding the
			// bundle: a fresh server over a copy would cost a push each.
			t.Parallel()
			reg := newRegistry(t)
			if _, err := bundle.Push(ctx, reg.Host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: regOpts()}); err != nil {
				t.Fatal(err)
			}
			reg.setFault(tt.fault)
			dst := filepath.Join(t.TempDir(), "wheelhouse")
			_, err := bundle.Pull(ctx, reg.Host+"/team/wheels:"+tt.tag, dst, bundle.PullOptions{Registry: regOpts()})
			if err == nil {
				t.Fatal("pull succeeded")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("error %q carries a signed URL's secret", err)
			}
			assertNoPull(t, dst)
		})
	}
}

func status(code int, pathPart string) func(w http.ResponseWriter, r *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.Contains(r.URL.Path, pathPart) {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		codes := map[int]string{401: "UNAUTHORIZED", 403: "DENIED", 404: "BLOB_UNKNOWN", 500: "UNKNOWN"}
		json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": codes[code], "message": "injected"}}})
		return true
	}
}

// pushRaw pushes a hand-made manifest whose layers are the given files
// under the given titles, bypassing every check Push makes.
func pushRaw(t *testing.T, ref string, titles []string, blobs [][]byte) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	var layers []v1.Descriptor
	for i, b := range blobs {
		l := static.NewLayer(b, "application/vnd.oci.image.layer.v1.tar")
		if err := remote.WriteLayer(r.Context(), l); err != nil {
			t.Fatal(err)
		}
		d, _ := l.Digest()
		layers = append(layers, v1.Descriptor{MediaType: "application/vnd.oci.image.layer.v1.tar", Size: int64(len(b)), Digest: d,
			Annotations: map[string]string{bundle.AnnotationTitle: titles[i]}})
	}
	putManifest(t, r, layers)
}

// putManifest pushes an artifact manifest with the empty config and the
// given layers (whose blobs the caller pushed, or not) under r.
func putManifest(t *testing.T, r name.Reference, layers []v1.Descriptor) {
	t.Helper()
	config := static.NewLayer([]byte("{}"), bundle.EmptyMediaType)
	if err := remote.WriteLayer(r.Context(), config); err != nil {
		t.Fatal(err)
	}
	cd, _ := config.Digest()
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: "application/vnd.unknown.artifact.v1",
		Config: v1.Descriptor{MediaType: bundle.EmptyMediaType, Size: 2, Digest: cd}, Layers: layers}
	raw, _ := json.Marshal(m)
	if err := remote.Put(r, rawTaggable(raw)); err != nil {
		t.Fatal(err)
	}
}

type rawTaggable []byte

func (m rawTaggable) RawManifest() ([]byte, error)        { return m, nil }
func (m rawTaggable) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

func TestPullRefusesBadArtifacts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	dir := t.TempDir()
	good, err := wheeltest.Simple(dir, "demo", "1.0")
	if err != nil {
		t.Fatal(err)
	}
	goodBytes, _ := os.ReadFile(good)
	lying, err := wheeltest.Write(dir, "liar-1.0-py3-none-any.whl", "liar", "1.0",
		[]wheeltest.File{{Name: "liar/__init__.py", Data: strings.NewReader("x = 1\n")}}, wheeltest.Options{LieAbout: "liar/__init__.py"})
	if err != nil {
		t.Fatal(err)
	}
	lyingBytes, _ := os.ReadFile(lying)
	// Python's layout (deflated, sizes in the local headers).
	text := strings.Repeat("import torch  # deflates well\n", 20000)
	pyLying, err := wheeltest.Write(t.TempDir(), "liar-1.0-py3-none-any.whl", "liar", "1.0",
		[]wheeltest.File{{Name: "liar/big.py", Data: strings.NewReader(text)}}, wheeltest.Options{DeflateSized: true, LieAbout: "liar/big.py"})
	if err != nil {
		t.Fatal(err)
	}
	pyLyingBytes, _ := os.ReadFile(pyLying)
	pyGood, err := wheeltest.Write(t.TempDir(), "demo-1.0-py3-none-any.whl", "demo", "1.0",
		[]wheeltest.File{{Name: "demo/big.py", Data: strings.NewReader(text)}}, wheeltest.Options{DeflateSized: true})
	if err != nil {
		t.Fatal(err)
	}
	pyCorrupt, _ := os.ReadFile(pyGood)
	for i := 30 + len("demo/big.py") + 40; i < 30+len("demo/big.py")+60; i++ {
		pyCorrupt[i] ^= 0x5a
	}
	// Entries that would land outside the install directory.
	escaping := map[string][]byte{}
	for _, entry := range []string{"../evil.py", "/etc/evil.py", "demo/../../evil.py"} {
		d := t.TempDir()
		p, err := wheeltest.Write(d, "demo-1.0-py3-none-any.whl", "demo", "1.0", []wheeltest.File{{Name: entry, Data: strings.NewReader("x = 1\n")}}, wheeltest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		escaping[entry], _ = os.ReadFile(p)
	}
	tests := []struct {
		name    string
		titles  []string
		blobs   [][]byte
		wantErr string
	}{
		{"dotdot", []string{"../demo-1.0-py3-none-any.whl"}, [][]byte{goodBytes}, "path separators"},
		{"absolute", []string{"/tmp/demo-1.0-py3-none-any.whl"}, [][]byte{goodBytes}, "path separators"},
		{"nested", []string{"a/demo-1.0-py3-none-any.whl"}, [][]byte{goodBytes}, "path separators"},
		{"odd characters", []string{"demo-1.0-py3-none-any\n.whl"}, [][]byte{goodBytes}, "refused"},
		{"not a wheel", []string{"notes.txt"}, [][]byte{[]byte("hello")}, "does not end in .whl"},
		{"duplicate titles", []string{"demo-1.0-py3-none-any.whl", "demo-1.0-py3-none-any.whl"}, [][]byte{goodBytes, append(goodBytes, 0)}, "appears twice"},
		{"lying RECORD", []string{"liar-1.0-py3-none-any.whl"}, [][]byte{lyingBytes}, "liar-1.0-py3-none-any.whl"},
		{"lying RECORD, deflated with sizes", []string{"liar-1.0-py3-none-any.whl"}, [][]byte{pyLyingBytes}, "wheel liar-1.0-py3-none-any.whl: liar/big.py: RECORD says"},
		{"corrupt deflated entry", []string{"demo-1.0-py3-none-any.whl"}, [][]byte{pyCorrupt}, "wheel demo-1.0-py3-none-any.whl: not a readable zip archive: demo/big.py: flate: corrupt input"},
		{"corrupt zip", []string{"demo-1.0-py3-none-any.whl"}, [][]byte{goodBytes[:len(goodBytes)/2]}, "not a readable zip"},
		{"entry with ..", []string{"demo-1.0-py3-none-any.whl"}, [][]byte{escaping["../evil.py"]}, `entry "../evil.py": not a safe relative path`},
		{"absolute entry", []string{"demo-1.0-py3-none-any.whl"}, [][]byte{escaping["/etc/evil.py"]}, `entry "/etc/evil.py": not a safe relative path`},
		{"entry climbing out", []string{"demo-1.0-py3-none-any.whl"}, [][]byte{escaping["demo/../../evil.py"]}, "not a safe relative path"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref := reg.Host + "/bad/artifact:" + string(rune('a'+i))
			pushRaw(t, ref, tt.titles, tt.blobs)
			dst := filepath.Join(t.TempDir(), "wheelhouse")
			_, err := bundle.Pull(ctx, ref, dst, bundle.PullOptions{Registry: regOpts()})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("pull error = %v, want it to contain %q", err, tt.wantErr)
			}
			assertNoPull(t, dst)
			if _, err := os.Stat(filepath.Join(filepath.Dir(dst), "demo-1.0-py3-none-any.whl")); err == nil {
				t.Error("a wheel escaped the target directory")
			}
		})
	}
	// An artifact pushed by another tool (no lock, generic media types)
	// pulls when its files are good wheels.
	ref := reg.Host + "/other/tool:v1"
	pushRaw(t, ref, []string{"demo-1.0-py3-none-any.whl"}, [][]byte{goodBytes})
	if _, err := bundle.Pull(ctx, ref, filepath.Join(t.TempDir(), "w"), bundle.PullOptions{Registry: regOpts()}); err != nil {
		t.Errorf("pull of a lock-less artifact: %v", err)
	}
}

func TestPullTargetMustBeEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	ref := reg.Host + "/team/wheels:v1"
	if _, err := bundle.Push(ctx, ref, scan(t, wheelhouse(t, 1)), bundle.PushOptions{Registry: regOpts()}); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := os.WriteFile(filepath.Join(dst, "keep.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Pull(ctx, ref, dst, bundle.PullOptions{Registry: regOpts()}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("pull into a non-empty dir: %v", err)
	}
	empty := t.TempDir()
	if _, err := bundle.Pull(ctx, ref, empty, bundle.PullOptions{Registry: regOpts()}); err != nil {
		t.Fatalf("pull into an empty dir: %v", err)
	}
}

func TestScanFaults(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := wheeltest.Simple(dir, "good", "1.0"); err != nil {
		t.Fatal(err)
	}
	if _, err := wheeltest.Write(dir, "liar-1.0-py3-none-any.whl", "liar", "1.0",
		[]wheeltest.File{{Name: "liar/x.py", Data: strings.NewReader("x")}}, wheeltest.Options{LieAbout: "liar/x.py"}); err != nil {
		t.Fatal(err)
	}
	if _, err := wheeltest.Write(dir, "escape-1.0-py3-none-any.whl", "escape", "1.0",
		[]wheeltest.File{{Name: "../escape.py", Data: strings.NewReader("x")}}, wheeltest.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken-1.0-py3-none-any.whl"), []byte("PK not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "good-1.0-py3-none-any.whl"))
	if err := os.WriteFile(filepath.Join(dir, "Good-1.0-py3-none-any.whl"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := bundle.Scan(context.Background(), dir, bundle.ScanOptions{Jobs: 2})
	var we *bundle.WheelhouseError
	if !errors.As(err, &we) {
		t.Fatalf("Scan error = %v, want a WheelhouseError", err)
	}
	for _, want := range []string{
		"README.txt: wheel file name \"README.txt\": does not end in .whl",
		"sub: not a regular file",
		"duplicate of",
		"wheel liar-1.0-py3-none-any.whl: liar/x.py: RECORD says",
		"wheel broken-1.0-py3-none-any.whl: not a readable zip",
		`wheel escape-1.0-py3-none-any.whl: entry "../escape.py": not a safe relative path`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Scan error does not contain %q:\n%v", want, err)
		}
	}
	if len(we.Problems) != 6 {
		t.Errorf("%d problems, want 6:\n%v", len(we.Problems), err)
	}
}

func TestTLSByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t) // plain HTTP on loopback
	wheels := scan(t, wheelhouse(t, 1))
	o := regOpts()
	o.PlainHTTP = false
	if _, err := bundle.Push(ctx, reg.Host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: o}); err == nil {
		t.Fatal("push to a plain-HTTP registry succeeded without --plain-http")
	}
	if reg.blobBytes.Load() != 0 {
		t.Fatal("bytes went over plain HTTP without --plain-http")
	}
	// The same registry over TLS works without PlainHTTP.
	inner := registryHandler()
	tlsSrv := httptest.NewTLSServer(inner)
	t.Cleanup(tlsSrv.Close)
	o.Transport = tlsSrv.Client().Transport
	host := strings.TrimPrefix(tlsSrv.URL, "https://")
	if _, err := bundle.Push(ctx, host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: o}); err != nil {
		t.Fatalf("push over TLS: %v", err)
	}
	if _, err := bundle.Pull(ctx, host+"/team/wheels:v1", filepath.Join(t.TempDir(), "w"), bundle.PullOptions{Registry: o}); err != nil {
		t.Fatalf("pull over TLS: %v", err)
	}
}

func TestBasicAuth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	inner := registryHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	wheels := scan(t, wheelhouse(t, 1))
	o := regOpts()
	o.Keychain = emptyKeychain{}
	_, err := bundle.Push(ctx, host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: o})
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("anonymous push error = %v, want a 401", err)
	}
	o.Username, o.Password = "ci", "wrong"
	if _, err := bundle.Push(ctx, host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: o}); err == nil || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("push with a wrong password: %v (and the password must never be echoed)", err)
	}
	o.Password = "s3cret"
	if _, err := bundle.Push(ctx, host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: o}); err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	// Pull reads the manifest through ggcr and the blobs through its own
	// client: both must carry the credentials.
	o.Password = "wrong"
	dst := filepath.Join(t.TempDir(), "wheelhouse")
	if _, err := bundle.Pull(ctx, host+"/team/wheels:v1", dst, bundle.PullOptions{Registry: o}); err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("pull with a wrong password: %v, want a 401 that does not echo the password", err)
	}
	assertNoPull(t, dst)
	o.Password = "s3cret"
	if _, err := bundle.Pull(ctx, host+"/team/wheels:v1", dst, bundle.PullOptions{Registry: o}); err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
}

// A registry that sends blob downloads to storage elsewhere (S3, GCS,
// a CDN) with a signed URL: the pull follows the redirect, and the
// registry's credentials go to the registry only.
func TestPullRedirectToStorage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	inner := registryHandler()
	var storageGets, storageAuth atomic.Int32
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		storageGets.Add(1)
		if r.Header.Get("Authorization") != "" {
			storageAuth.Add(1)
		}
		if r.URL.Query().Get("sig") != "signed" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		// Serve what the registry holds for the digest in the path.
		req := r.Clone(r.Context())
		req.URL.Path = "/v2/team/wheels/blobs/" + strings.TrimPrefix(r.URL.Path, "/store/")
		req.URL.RawQuery = ""
		req.SetBasicAuth("ci", "s3cret")
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(storage.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if _, d, ok := strings.Cut(r.URL.Path, "/blobs/sha256:"); ok && r.Method == http.MethodGet {
			http.Redirect(w, r, storage.URL+"/store/sha256:"+d+"?sig=signed", http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	o := regOpts()
	o.Username, o.Password = "ci", "s3cret"
	wheels := scan(t, wheelhouse(t, 2))
	if _, err := bundle.Push(ctx, host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: o}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "wheelhouse")
	res, err := bundle.Pull(ctx, host+"/team/wheels:v1", dst, bundle.PullOptions{Registry: o})
	if err != nil {
		t.Fatalf("pull through a storage redirect: %v", err)
	}
	if len(res.Wheels) != 2 || storageGets.Load() < 2 {
		t.Fatalf("pulled %d wheels with %d storage GETs, want 2 wheels from storage", len(res.Wheels), storageGets.Load())
	}
	if n := storageAuth.Load(); n != 0 {
		t.Fatalf("%d requests to storage carried the registry's Authorization header", n)
	}
}

// Not parallel: DOCKER_CONFIG is process-wide.
func TestDockerConfigKeychain(t *testing.T) {
	ctx := context.Background()
	inner := registryHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "robot" || p != "from-config" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	cfg := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("robot:from-config"))
	if err := os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{"auths":{"`+host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", cfg)
	wheels := scan(t, wheelhouse(t, 1))
	if _, err := bundle.Push(ctx, host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: regOpts()}); err != nil {
		t.Fatalf("push with docker config credentials: %v", err)
	}
	if _, err := bundle.Pull(ctx, host+"/team/wheels:v1", filepath.Join(t.TempDir(), "wh"), bundle.PullOptions{Registry: regOpts()}); err != nil {
		t.Fatalf("pull with docker config credentials: %v", err)
	}
}

// A registry that redirects a blob download into the node's own network
// (the cloud metadata service, a private address, loopback under another
// name) is refused before anything is sent there. The test's transport
// dials loopback IP literals only, so a missing check fails the test on
// the dialer's refusal, never with traffic off the machine.
func TestPullRefusesRedirectIntoTheNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	wheels := scan(t, wheelhouse(t, 1))
	blobPath := "/blobs/sha256:" + wheels[0].SHA256
	for _, target := range []string{
		"http://169.254.169.254/latest/meta-data/",
		"http://10.0.0.7/blob",
		"http://0x7f.1/blob",
		"http://[::ffff:192.168.1.1]/blob",
	} {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			reg := newRegistry(t)
			o := regOpts()
			if _, err := bundle.Push(ctx, reg.Host+"/team/wheels:v1", wheels, bundle.PushOptions{Registry: o}); err != nil {
				t.Fatal(err)
			}
			reg.setFault(func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, blobPath) {
					return false
				}
				http.Redirect(w, r, target, http.StatusFound)
				return true
			})
			o.Transport = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				host, _, _ := net.SplitHostPort(addr)
				if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() {
					return nil, fmt.Errorf("test dialer: %s is not a loopback address", addr)
				}
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}
			dst := filepath.Join(t.TempDir(), "wheelhouse")
			_, err := bundle.Pull(ctx, reg.Host+"/team/wheels:v1", dst, bundle.PullOptions{Registry: o})
			if err == nil || !strings.Contains(err.Error(), "private or link-local address: refused") || strings.Contains(err.Error(), "test dialer") {
				t.Fatalf("redirect to %s: %v, want it refused before any dial", target, err)
			}
			assertNoPull(t, dst)
		})
	}
}

// A pull or an inspect authenticates to the registry once: the manifest,
// the lock, the referrers and the wheels share one handshake (with a
// token registry, one token request instead of one per client).
func TestOneHandshakePerPull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	if _, err := bundle.Push(ctx, reg.Host+"/team/wheels:v1", scan(t, wheelhouse(t, 3)), bundle.PushOptions{Registry: regOpts()}); err != nil {
		t.Fatal(err)
	}
	var pings atomic.Int32
	reg.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/v2/" {
			pings.Add(1)
		}
		return false
	})
	if _, err := bundle.Pull(ctx, reg.Host+"/team/wheels:v1", filepath.Join(t.TempDir(), "wh"), bundle.PullOptions{Registry: regOpts()}); err != nil {
		t.Fatal(err)
	}
	if n := pings.Swap(0); n != 1 {
		t.Errorf("pull pinged the registry %d times, want 1", n)
	}
	if _, err := bundle.Inspect(ctx, reg.Host+"/team/wheels:v1", bundle.PullOptions{Registry: regOpts()}); err != nil {
		t.Fatal(err)
	}
	if n := pings.Load(); n != 1 {
		t.Errorf("inspect pinged the registry %d times, want 1", n)
	}
}

// cancelAtEnd cancels when a blob's last byte has arrived, before the
// checks that read the file run.
type cancelAtEnd struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	size   map[string]int64
}

func (c *cancelAtEnd) Start(name string, size int64) {
	c.mu.Lock()
	c.size[name] = size
	c.mu.Unlock()
}

func (c *cancelAtEnd) Add(name string, n int64) {
	c.mu.Lock()
	c.size[name] -= n
	left := c.size[name]
	c.mu.Unlock()
	if left <= 0 {
		c.cancel()
	}
}

func (c *cancelAtEnd) Done(string, bool, error) {}

// A pull cancelled while a wheel is checked from its file (an artifact
// without a lock layer: its deflated entries are inflated there) stops
// with the cancellation, not with a verification failure, and leaves
// nothing.
func TestPullCancelledDuringCheck(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t)
	text := strings.Repeat("import torch  # deflates well\n", 20000)
	p, err := wheeltest.Write(t.TempDir(), "demo-1.0-py3-none-any.whl", "demo", "1.0",
		[]wheeltest.File{{Name: "demo/big.py", Data: strings.NewReader(text)}}, wheeltest.Options{DeflateSized: true})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	ref := reg.Host + "/cancel/me:v1"
	pushRaw(t, ref, []string{"demo-1.0-py3-none-any.whl"}, [][]byte{b})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dst := filepath.Join(t.TempDir(), "wheelhouse")
	_, err = bundle.Pull(ctx, ref, dst, bundle.PullOptions{Registry: regOpts(), Progress: &cancelAtEnd{cancel: cancel, size: map[string]int64{}}})
	if !errors.Is(err, context.Canceled) || errors.Is(err, bundle.ErrVerification) {
		t.Fatalf("pull cancelled during the check: %v, want context.Canceled and no verification failure", err)
	}
	assertNoPull(t, dst)
}
