package model

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// DefaultMaxModelBytes bounds the model file push sends and verify
// downloads, unless raised: a checkpoint shipped through the broker is at
// most api.MaxCheckpointBytes, a file named for push may be larger.
const DefaultMaxModelBytes int64 = 16 << 30

// Fields of the errors about the model file (*fielderr.Error): the command
// layer names its flags for them.
const (
	FieldFile    = "model file"
	FieldMaxSize = "model size limit"
	FieldRef     = "model reference"
)

// PushOptions configure Push.
type PushOptions struct {
	Registry bundle.RegistryOptions
	// Path is the model file to push; its base name is its title.
	Path string
	// Name, when set, is the title instead of Path's base name (a
	// checkpoint's name as the run shipped it).
	Name string
	// Predicate is the provenance to attest; Model is filled by Push.
	Predicate Predicate
	// Source is Predicate.Model.Source.
	Source string
	Signer audit.Signer
	// MaxBytes bounds the file (default DefaultMaxModelBytes).
	MaxBytes int64
	// Now is the created annotation's clock (default time.Now).
	Now func() time.Time
}

// PushResult is what Push did.
type PushResult struct {
	// Reference is the model artifact by digest: REPO@sha256:….
	Reference string `json:"reference"`
	Digest    string `json:"digest"`
	Tag       string `json:"tag,omitempty"`
	Model     Model  `json:"model"`
	// Attestation is the referrer manifest holding the signed
	// attestation, by digest.
	Attestation   string    `json:"attestation"`
	PredicateType string    `json:"predicateType"`
	Predicate     Predicate `json:"predicate"`
}

// CheckPush checks what a push is given before any work: ref is a tag
// reference, the file (when named) a regular file within maxBytes.
func CheckPush(ref, path string, maxBytes int64, reg bundle.RegistryOptions) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxModelBytes
	}
	r, err := reg.ParseReference(ref)
	if err != nil {
		return fielderr.New(FieldRef, ref, "%w", err)
	}
	if _, ok := r.(name.Digest); ok {
		return fielderr.New(FieldRef, ref, "names a digest: push to a tag (REGISTRY/REPOSITORY:TAG); the digest is what push prints")
	}
	if path == "" {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fielderr.New(FieldFile, path, "%w", err)
	}
	if !fi.Mode().IsRegular() {
		return fielderr.New(FieldFile, path, "is not a regular file: name the model file itself (a directory is not pushed; archive it first)")
	}
	if fi.Size() > maxBytes {
		return fielderr.New(FieldFile, path, "is %d bytes, over the %d allowed: raise {%s} if it is meant to be that large", fi.Size(), maxBytes, FieldMaxSize)
	}
	return nil
}

// Push uploads the model file as an OCI 1.1 artifact at ref (a tag) and
// attaches the signed in-toto attestation of the predicate to it: the
// blobs first, then the model manifest (and so the tag), then the
// attestation referrer, whose subject is the model manifest.
func Push(ctx context.Context, ref string, o PushOptions) (*PushResult, error) {
	if o.Signer == nil {
		return nil, errors.New("pushing a model: no signer")
	}
	limit := o.MaxBytes
	if limit <= 0 {
		limit = DefaultMaxModelBytes
	}
	if err := CheckPush(ref, o.Path, limit, o.Registry); err != nil {
		return nil, err
	}
	title := o.Name
	if title == "" {
		title = filepath.Base(o.Path)
	}
	f, err := hashFile(o.Path, limit)
	if err != nil {
		return nil, err
	}
	f.Name = title

	c, err := o.Registry.Open(ctx, ref, true)
	if err != nil {
		return nil, fmt.Errorf("pushing %s: %w", ref, err)
	}
	repo := c.Ref.Context()
	h, _ := v1.NewHash("sha256:" + f.SHA256)
	modelLayer := &fileLayer{path: o.Path, digest: h, size: f.Size}
	config := static.NewLayer([]byte(bundle.EmptyConfig), bundle.EmptyMediaType)
	configDigest, _ := config.Digest()
	for _, l := range []v1.Layer{config, modelLayer} {
		if err := remote.WriteLayer(repo, l, c.Push...); err != nil {
			d, _ := l.Digest()
			return nil, fmt.Errorf("pushing %s: uploading blob %s: %w", ref, d, bundle.Explain(err))
		}
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	created := now().UTC().Format(time.RFC3339)
	p := o.Predicate
	p.Model = Model{File: f, Source: o.Source}
	annotations := map[string]string{AnnotationCreated: created, AnnotationRun: p.Run.ID}
	if p.Run.Group != "" {
		annotations[AnnotationGroup] = p.Run.Group
	}
	if p.SpecFingerprint != "" {
		annotations[AnnotationFingerprint] = p.SpecFingerprint
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  ArtifactType,
		Config:        v1.Descriptor{MediaType: bundle.EmptyMediaType, Size: int64(len(bundle.EmptyConfig)), Digest: configDigest, Data: []byte(bundle.EmptyConfig)},
		Layers: []v1.Descriptor{{
			MediaType: ModelMediaType, Size: f.Size, Digest: h,
			Annotations: map[string]string{AnnotationTitle: title},
		}},
		Annotations: annotations,
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := remote.Put(c.Ref, rawManifest(raw), c.Push...); err != nil {
		return nil, fmt.Errorf("pushing %s: writing the manifest: %w", ref, bundle.Explain(err))
	}
	md, size, _ := v1.SHA256(bytes.NewReader(raw))
	res := &PushResult{Reference: repo.Digest(md.String()).String(), Digest: md.String(), Model: p.Model, PredicateType: PredicateType, Predicate: p}
	if t, ok := c.Ref.(name.Tag); ok {
		res.Tag = t.TagStr()
	}

	st, err := NewStatement(repo.Name(), md.Hex, p).Marshal()
	if err != nil {
		return nil, err
	}
	signed, err := o.Signer.SignDSSE(ctx, audit.InTotoPayloadType, st)
	if err != nil {
		return nil, fmt.Errorf("signing the attestation of %s: %w", res.Reference, err)
	}
	att, err := attach(ctx, c, v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: md, Size: size}, signed, configDigest, created)
	if err != nil {
		return nil, fmt.Errorf("attaching the attestation to %s: %w (the model is pushed; push again to attach it)", res.Reference, err)
	}
	res.Attestation = att
	return res, nil
}

// attach writes the signed bundle as a referrer of subject, as cosign's
// WriteAttestationNewBundleFormat does: the OCI empty config, one layer
// holding the bundle, cosign's annotations. ggcr's Put keeps the
// sha256-<hex> fallback tag's index up to date on a registry without the
// referrers API.
func attach(ctx context.Context, c *bundle.Client, subject v1.Descriptor, signed []byte, configDigest v1.Hash, created string) (string, error) {
	repo := c.Ref.Context()
	layer := static.NewLayer(signed, BundleMediaType)
	if err := remote.WriteLayer(repo, layer, c.Push...); err != nil {
		return "", bundle.Explain(err)
	}
	ld, _ := layer.Digest()
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  BundleMediaType,
		Config:        v1.Descriptor{MediaType: bundle.EmptyMediaType, Size: int64(len(bundle.EmptyConfig)), Digest: configDigest},
		Layers:        []v1.Descriptor{{MediaType: BundleMediaType, Size: int64(len(signed)), Digest: ld}},
		Subject:       &subject,
		Annotations: map[string]string{
			AnnotationCreated:             created,
			AnnotationBundleContent:       "dsse-envelope",
			AnnotationBundlePredicateType: PredicateType,
		},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	d, _, _ := v1.SHA256(bytes.NewReader(raw))
	at := repo.Digest(d.String())
	if err := remote.Put(at, rawManifest(raw), append(c.Push, remote.WithContext(ctx))...); err != nil {
		return "", bundle.Explain(err)
	}
	return at.String(), nil
}

// hashFile checks path is a regular file within limit and returns its
// digest and size.
func hashFile(path string, limit int64) (File, error) {
	if path == "" {
		return File{}, &fielderr.Error{Field: FieldFile, Problem: "is required: name the model file to push"}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return File{}, fielderr.New(FieldFile, path, "%w", err)
	}
	fh, err := os.Open(path)
	if err != nil {
		return File{}, fielderr.New(FieldFile, path, "%w", err)
	}
	defer fh.Close()
	hs := sha256.New()
	// One more byte than the limit: a file that grows while it is read
	// is refused, not pushed cut.
	n, err := io.Copy(hs, io.LimitReader(fh, limit+1))
	if err != nil {
		return File{}, fielderr.New(FieldFile, path, "%w", err)
	}
	if n != fi.Size() {
		return File{}, fielderr.New(FieldFile, path, "changed while it was read (%d bytes, then %d): push it once it is written", fi.Size(), n)
	}
	return File{Name: filepath.Base(path), SHA256: hex.EncodeToString(hs.Sum(nil)), Size: n}, nil
}

type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// fileLayer is the model file, read from disk each time it is sent; its
// digest and size were computed before, so nothing is read when the
// registry has the blob.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return ModelMediaType, nil }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return l.Compressed() }
func (l *fileLayer) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	// The bytes sent are the bytes hashed: a file changed since is
	// refused by the registry (digest mismatch), never pushed as another.
	return f, nil
}
