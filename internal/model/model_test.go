package model_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/model"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

func signer(t *testing.T) (*audit.KeySigner, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := audit.NewKeySigner(key, "")
	if err != nil {
		t.Fatal(err)
	}
	return s, key
}

func modelFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ckpt-40.pt")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var fp = "sha256:" + strings.Repeat("4e", 32)

var pred = model.Predicate{
	SpecFingerprint: fp,
	Run:             model.Run{ID: "alloc-1", Group: "group-1", Region: "us-west-2", State: "succeeded"},
	Nodes:           []model.Node{{NodeID: "node-1", RunReportSHA256: strings.Repeat("a", 64), AgentKeySHA256: strings.Repeat("b", 64), RuntimeFingerprint: fp}},
	Metrics:         &model.Metrics{LastStep: 40, Values: map[string]float64{"loss": 0.25}},
}

func regOpts() bundle.RegistryOptions { return bundle.RegistryOptions{PlainHTTP: true} }

// Push then Verify on a registry with the referrers API and one without
// (the sha256-<hex> tag), and a changed model blob fails the model layer.
func TestPushVerify(t *testing.T) {
	t.Parallel()
	for _, api := range []bool{true, false} {
		t.Run(fmt.Sprintf("referrers-api=%v", api), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var tamper atomic.Bool
			host := startRegistry(t, api, &tamper, len("weights"))
			s, key := signer(t)
			res, err := model.Push(ctx, host+"/team/model:v1", model.PushOptions{Registry: regOpts(), Path: modelFile(t, "weights"), Predicate: pred, Source: model.SourceFile, Signer: s})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(res.Reference, host+"/team/model@sha256:") || res.Model.Size != 7 {
				t.Fatalf("push = %+v", res)
			}
			v, err := model.Verify(ctx, host+"/team/model:v1", model.VerifyOptions{Registry: regOpts(), Key: key.Public()})
			if err != nil {
				t.Fatal(err)
			}
			if !v.OK || v.Predicate == nil || v.Predicate.Run.ID != "alloc-1" || v.Attestation != res.Attestation {
				t.Fatalf("verify = %+v", v)
			}
			if err := validate(t, schema(t), *v.Predicate); err != nil {
				t.Errorf("the predicate push wrote does not validate against the schema: %v", err)
			}
			via := "referrers API"
			if !api {
				via = "tag sha256-"
			}
			if !strings.Contains(v.Layers[1].Detail, via) {
				t.Errorf("attestation layer %q, want found through the %s", v.Layers[1].Detail, via)
			}

			// Another key: the signature layer fails.
			_, other := signer(t)
			v, err = model.Verify(ctx, res.Reference, model.VerifyOptions{Registry: regOpts(), Key: other.Public()})
			if err != nil || v.OK || v.FailedLayer != model.LayerSignature {
				t.Errorf("verify with another key = %+v, %v; want the signature layer failed", v, err)
			}

			tamper.Store(true)
			v, err = model.Verify(ctx, res.Reference, model.VerifyOptions{Registry: regOpts(), Key: key.Public()})
			if err != nil || v.OK || v.FailedLayer != model.LayerModel || !strings.Contains(v.Layers[len(v.Layers)-1].Problems[0].Message, "the stored model was changed") {
				t.Errorf("verify of a changed blob = %+v, %v; want the model layer failed", v, err)
			}
		})
	}
}

// startRegistry serves ggcr's registry; with tamper set, a blob of size
// bytes is served with its first byte changed, as a registry whose
// storage was edited would serve it.
func startRegistry(t *testing.T, api bool, tamper *atomic.Bool, size int) string {
	t.Helper()
	return regtest.StartInProcessRegistry(t, api, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !tamper.Load() || r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/sha256:") {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			b := rec.Body.Bytes()
			if len(b) == size {
				b[0] ^= 0xff
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(b)
		})
	})
}

// A hostile registry cannot make verify read without bound: an oversized
// manifest fails the artifact layer, an oversized referrers list or
// bundle the attestation layer, each saying what was refused.
func TestVerifyBoundsWhatItReads(t *testing.T) {
	t.Parallel()
	big := strings.Repeat(" ", bundle.MaxManifest+1)
	for _, tc := range []struct {
		name, layer, want string
		serve             func(w http.ResponseWriter, r *http.Request) bool
		attach            int64 // a referrer whose bundle layer is this big
	}{
		{name: "manifest", layer: model.LayerArtifact, want: "sent more than 4194304 bytes of manifest",
			serve: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/manifests/v1") {
					w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
					w.Write([]byte(big))
					return true
				}
				return false
			}},
		{name: "referrers list", layer: model.LayerAttestation, want: "bytes of referrers list",
			serve: func(w http.ResponseWriter, r *http.Request) bool {
				if strings.Contains(r.URL.Path, "/referrers/") {
					w.Header().Set("Content-Type", "application/vnd.oci.image.index.v1+json")
					w.Write([]byte(big))
					return true
				}
				return false
			}},
		// Skipped, said in the layer; the good bundle beside it verifies.
		{name: "bundle", want: "the bundle is 1048577 bytes, at most 1048576 are read", attach: model.MaxBundleBytes + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var hostile atomic.Bool
			host := regtest.StartInProcessRegistry(t, true, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if hostile.Load() && tc.serve != nil && tc.serve(w, r) {
						return
					}
					next.ServeHTTP(w, r)
				})
			})
			s, key := signer(t)
			ref := host + "/team/model:v1"
			res, err := model.Push(ctx, ref, model.PushOptions{Registry: regOpts(), Path: modelFile(t, "weights"), Predicate: pred, Source: model.SourceFile, Signer: s})
			if err != nil {
				t.Fatal(err)
			}
			if tc.attach > 0 {
				attachOversized(t, res, tc.attach)
			}
			hostile.Store(true)
			v, err := model.Verify(ctx, ref, model.VerifyOptions{Registry: regOpts(), Key: key.Public()})
			if err != nil {
				t.Fatal(err)
			}
			if v.FailedLayer != tc.layer || v.OK != (tc.layer == "") {
				t.Fatalf("verify = %+v, want the layer %q failed", v, tc.layer)
			}
			var msgs []string
			for _, l := range v.Layers {
				msgs = append(msgs, l.Detail)
				for _, p := range l.Problems {
					msgs = append(msgs, p.Message)
				}
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tc.want) {
				t.Errorf("problems %q, want one saying %q", msgs, tc.want)
			}
		})
	}
}

// attachOversized attaches to the pushed model a referrer whose bundle
// layer claims size bytes.
func attachOversized(t *testing.T, res *model.PushResult, size int64) {
	t.Helper()
	d, err := name.NewDigest(res.Reference, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	m := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":%q,`+
		`"config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},`+
		`"layers":[{"mediaType":%q,"digest":"sha256:%s","size":%d}],`+
		`"subject":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":%q,"size":1}}`,
		model.BundleMediaType, model.BundleMediaType, strings.Repeat("0", 64), size, res.Digest)
	h, _, _ := v1.SHA256(strings.NewReader(m))
	if err := remote.Put(d.Context().Digest(h.String()), rawManifest(m)); err != nil {
		t.Fatal(err)
	}
}

type rawManifest string

func (m rawManifest) RawManifest() ([]byte, error)        { return []byte(m), nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
