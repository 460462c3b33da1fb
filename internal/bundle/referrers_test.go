package bundle_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupass/gpupass/internal/bundle"
)

// attach pushes an artifact manifest whose subject is the manifest at
// subject (REPO@sha256:...), the way oras attach or cosign do, and returns
// its digest. The bundle push already stored the empty config blob.
func attach(t *testing.T, subject, artifactType string) string {
	t.Helper()
	d, err := name.NewDigest(subject, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(d)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, _ := v1.SHA256(strings.NewReader(bundle.EmptyConfig))
	m := map[string]any{
		"schemaVersion": 2,
		"mediaType":     types.OCIManifestSchema1,
		"artifactType":  artifactType,
		"config":        map[string]any{"mediaType": bundle.EmptyMediaType, "digest": cfg.String(), "size": 2},
		"layers":        []any{},
		"subject":       map[string]any{"mediaType": desc.MediaType, "digest": desc.Digest.String(), "size": desc.Size},
		"annotations":   map[string]string{"org.opencontainers.image.created": "2026-11-29T00:00:00Z"},
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	h, _, _ := v1.SHA256(strings.NewReader(string(b)))
	if err := remote.Put(d.Context().Digest(h.String()), rawTaggable(b)); err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// Inspect lists what is attached to a bundle, on a registry with the
// referrers API and on one without it, where OCI 1.1 clients keep the
// list under the sha256-<hex> tag instead.
func TestInspectListsReferrers(t *testing.T) {
	t.Parallel()
	for _, api := range []bool{true, false} {
		t.Run(fmt.Sprintf("referrers-api=%v", api), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reg := newRegistry(t, registry.WithReferrersSupport(api))
			res, err := bundle.Push(ctx, reg.Host+"/team/wheels:v1", scan(t, wheelhouse(t, 2)), bundle.PushOptions{Registry: regOpts()})
			if err != nil {
				t.Fatal(err)
			}
			info, err := bundle.Inspect(ctx, res.Reference, bundle.PullOptions{Registry: regOpts()})
			if err != nil || info.ReferrersError != "" || info.Referrers == nil || len(info.Referrers) != 0 {
				t.Fatalf("a bundle with nothing attached: referrers %v, error %q / %v", info.Referrers, info.ReferrersError, err)
			}

			sbom := attach(t, res.Reference, "application/spdx+json")
			sig := attach(t, res.Reference, "application/vnd.dev.sigstore.bundle.v0.3+json")
			info, err = bundle.Inspect(ctx, reg.Host+"/team/wheels:v1", bundle.PullOptions{Registry: regOpts()})
			if err != nil || info.ReferrersError != "" {
				t.Fatalf("inspect: %v / %q", err, info.ReferrersError)
			}
			var got []string
			for _, r := range info.Referrers {
				got = append(got, r.ArtifactType+" "+r.Digest)
			}
			want := []string{"application/spdx+json " + sbom, "application/vnd.dev.sigstore.bundle.v0.3+json " + sig}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("referrers:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if info.Referrers[0].Annotations["org.opencontainers.image.created"] == "" {
				t.Errorf("referrer annotations lost: %+v", info.Referrers[0])
			}

			// Which path served the list: the fallback tag exists only
			// where the registry has no referrers API.
			tag, err := name.NewTag(reg.Host+"/team/wheels:"+strings.Replace(info.Digest, ":", "-", 1), name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			_, err = remote.Head(tag)
			if api && err == nil {
				t.Error("the fallback tag exists on a registry with the referrers API")
			}
			if !api && err != nil {
				t.Errorf("no fallback tag on a registry without the referrers API: %v", err)
			}
		})
	}
}

// A registry that fails the referrers lookup does not fail inspect: the
// bundle is listed and the error says what went wrong.
func TestInspectReferrersFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := newRegistry(t)
	res, err := bundle.Push(ctx, reg.Host+"/team/wheels:v1", scan(t, wheelhouse(t, 1)), bundle.PushOptions{Registry: regOpts()})
	if err != nil {
		t.Fatal(err)
	}
	reg.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.Contains(r.URL.Path, "/referrers/") || strings.Contains(r.URL.Path, "/manifests/sha256-") {
			http.Error(w, `{"errors":[{"code":"UNKNOWN","message":"storage down"}]}`, http.StatusInternalServerError)
			return true
		}
		return false
	})
	info, err := bundle.Inspect(ctx, res.Reference, bundle.PullOptions{Registry: regOpts()})
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Layers) != 2 || !strings.Contains(info.ReferrersError, "listing referrers of "+res.Reference) {
		t.Fatalf("layers %d, referrers error %q", len(info.Layers), info.ReferrersError)
	}
}
