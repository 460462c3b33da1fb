package bundle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// manifestAccept is what a pull asks for: the two image manifest types a
// bundle may be, and the index types only so that a reference to an
// index is refused with a clear error rather than a 404.
var manifestAccept = strings.Join([]string{
	string(types.OCIManifestSchema1), string(types.DockerManifestSchema2),
	string(types.OCIImageIndex), string(types.DockerManifestList),
}, ",")

// getManifest reads the manifest at r itself rather than through ggcr,
// which reads up to 100 MB and, for a tag, trusts whatever bytes come:
// here at most maxManifest bytes are read (a larger Content-Length is
// refused before a byte), and the bytes must hash to the digest the
// registry states (Docker-Content-Digest, as oras checks) and, for a
// reference by digest, to that digest. It returns the bytes, their
// sha256 and the Content-Type.
func getManifest(ctx context.Context, c *http.Client, r name.Reference) ([]byte, v1.Hash, string, error) {
	repo := r.Context()
	u := url.URL{Scheme: repo.Scheme(), Host: repo.RegistryStr(), Path: fmt.Sprintf("/v2/%s/manifests/%s", repo.RepositoryStr(), r.Identifier())}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, v1.Hash{}, "", err
	}
	req.Header.Set("Accept", manifestAccept)
	resp, err := c.Do(req)
	if err != nil {
		return nil, v1.Hash{}, "", redactURL(err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return nil, v1.Hash{}, "", err
	}
	if resp.ContentLength > maxManifest {
		return nil, v1.Hash{}, "", fmt.Errorf("%w: registry %s announces a manifest of %d bytes; one of a bundle or a model is at most %d", ErrVerification, repo.RegistryStr(), resp.ContentLength, maxManifest)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxManifest+1))
	if err != nil {
		return nil, v1.Hash{}, "", redactURL(err)
	}
	if len(raw) > maxManifest {
		return nil, v1.Hash{}, "", fmt.Errorf("%w: registry %s sent more than %d bytes of manifest; one of a bundle or a model is a few kilobytes (stopped reading)", ErrVerification, repo.RegistryStr(), maxManifest)
	}
	got, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return nil, v1.Hash{}, "", err
	}
	if h := resp.Header.Get("Docker-Content-Digest"); h != "" {
		stated, err := v1.NewHash(h)
		if err != nil {
			return nil, v1.Hash{}, "", fmt.Errorf("%w: registry %s states the manifest digest %q: %w", ErrVerification, repo.RegistryStr(), h, err)
		}
		if stated.Algorithm == got.Algorithm && stated != got {
			return nil, v1.Hash{}, "", fmt.Errorf("%w: mismatched digest: registry %s states the manifest is %s, but its bytes hash to %s (changed in storage or on the way)", ErrVerification, repo.RegistryStr(), stated, got)
		}
	}
	if d, ok := r.(name.Digest); ok && d.DigestStr() != got.String() {
		return nil, v1.Hash{}, "", fmt.Errorf("%w: mismatched digest: asked for %s, the registry's manifest bytes hash to %s", ErrVerification, d.DigestStr(), got)
	}
	return raw, got, resp.Header.Get("Content-Type"), nil
}

// emptyDigest is the digest of EmptyConfig.
const emptyDigest = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

// checkManifest parses a manifest's bytes and checks what a pull relies
// on before any blob is fetched: an image manifest of schema 2 (the media
// type in its bytes agreeing with the one the registry served it as), a
// well-formed config descriptor (the OCI empty descriptor exactly, for a
// gpupass bundle) and well-formed media types on every layer.
func checkManifest(raw []byte, contentType string) (*v1.Manifest, error) {
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	var extra struct {
		Manifests json.RawMessage `json:"manifests"`
	}
	_ = json.Unmarshal(raw, &extra)
	served, _, _ := mime.ParseMediaType(contentType)
	mt := m.MediaType
	switch {
	case mt == "":
		mt = types.MediaType(served)
	case served != "" && served != string(mt) && served != "application/json" && served != "application/octet-stream":
		return nil, fmt.Errorf("its bytes say mediaType %s but the registry serves it as %s", m.MediaType, served)
	}
	if mt.IsIndex() || (mt == "" && extra.Manifests != nil) {
		return nil, fmt.Errorf("it is an index (%s), not a bundle's image manifest: name the bundle itself", mt)
	}
	if mt != types.OCIManifestSchema1 && mt != types.DockerManifestSchema2 {
		return nil, fmt.Errorf("it is a %q, not an OCI image manifest", mt)
	}
	if m.SchemaVersion != 2 {
		return nil, fmt.Errorf("schemaVersion %d, want 2", m.SchemaVersion)
	}
	if err := checkDescriptor(m.Config); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if m.Config.MediaType == EmptyMediaType || m.ArtifactType == ArtifactType {
		if m.Config.MediaType != EmptyMediaType || m.Config.Digest.String() != emptyDigest || m.Config.Size != int64(len(EmptyConfig)) {
			return nil, fmt.Errorf("config is %s %s (%d bytes); a bundle's config is the OCI empty descriptor %s %s (%d bytes)",
				m.Config.MediaType, m.Config.Digest, m.Config.Size, EmptyMediaType, emptyDigest, len(EmptyConfig))
		}
	}
	for i, l := range m.Layers {
		if err := checkDescriptor(l); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return &m, nil
}

// checkDescriptor checks a descriptor's shape: a media type as RFC 6838
// writes them (no parameters), a digest the manifest can name, a size
// that is not negative.
func checkDescriptor(d v1.Descriptor) error {
	if !validMediaType(string(d.MediaType)) {
		return fmt.Errorf("media type %q is not a media type (type/subtype)", d.MediaType)
	}
	if d.Digest.Algorithm == "" || d.Digest.Hex == "" {
		return fmt.Errorf("%s has no digest", d.MediaType)
	}
	if d.Size < 0 {
		return fmt.Errorf("%s %s has a negative size", d.MediaType, d.Digest)
	}
	return nil
}

// validMediaType: RFC 6838 restricted names, type "/" subtype.
func validMediaType(s string) bool {
	typ, sub, ok := strings.Cut(s, "/")
	return ok && restrictedName(typ) && restrictedName(sub)
}

func restrictedName(s string) bool {
	if s == "" || len(s) > 127 {
		return false
	}
	for i, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && strings.IndexByte("!#$&-^_.+", c) >= 0:
		default:
			return false
		}
	}
	return true
}
