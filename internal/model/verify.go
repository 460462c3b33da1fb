package model

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/bundle"
)

// Verification layers, in the order they are checked.
const (
	LayerArtifact    = "artifact"
	LayerAttestation = "attestation"
	LayerSignature   = "signature"
	LayerStatement   = "statement"
	LayerModel       = "model"
)

// Limits on what Verify reads from a registry.
const (
	// MaxReferrers is how many referrers of the model are looked at.
	MaxReferrers = 64
	// MaxBundleBytes bounds a sigstore bundle (a key-signed one is
	// about 2 KB, a keyless one with its certificate chain and log
	// entries about 10 KB).
	MaxBundleBytes = 1 << 20
)

// VerifyOptions control Verify.
type VerifyOptions struct {
	Registry bundle.RegistryOptions
	// Key is the cosign public key the attestation must be signed with;
	// Identity, instead, the keyless signer it must have (as for an
	// audit report).
	Key      crypto.PublicKey
	Identity *audit.Identity
	// MaxBytes bounds the model file downloaded (default
	// DefaultMaxModelBytes).
	MaxBytes int64
	// Out, when set, is where the model file is written once its bytes
	// verified (never overwritten).
	Out string
}

// Result is the outcome of Verify, layer by layer (the shape of
// audit.Result).
type Result struct {
	OK          bool   `json:"ok"`
	FailedLayer string `json:"failed_layer,omitempty"`
	// Reference is the model artifact by digest.
	Reference string `json:"reference"`
	Digest    string `json:"digest"`
	// Attestation is the referrer that verified, by digest.
	Attestation   string `json:"attestation,omitempty"`
	PredicateType string `json:"predicateType,omitempty"`
	// Predicate is set when the attestation verified.
	Predicate *Predicate `json:"predicate,omitempty"`
	// SignedBy is who signed a keyless attestation.
	SignedBy *audit.SignedBy `json:"signed_by,omitempty"`
	Layers   []audit.Layer   `json:"layers"`
	// Written is Out, when the model was written there.
	Written string `json:"written,omitempty"`
}

func (r *Result) add(l audit.Layer) bool {
	l.OK = len(l.Problems) == 0
	l.Status = audit.StatusOK
	if !l.OK {
		l.Status = audit.StatusFail
		if r.FailedLayer == "" {
			r.FailedLayer = l.Name
		}
	}
	r.Layers = append(r.Layers, l)
	return l.OK
}

func (r *Result) skip(names ...string) {
	for _, n := range names {
		r.Layers = append(r.Layers, audit.Layer{Name: n, Status: audit.StatusSkipped, Detail: "not checked: " + r.FailedLayer + " failed"})
	}
}

func fail(layer, check, format string, args ...any) audit.Layer {
	return audit.Layer{Name: layer, Problems: []audit.Problem{{Check: check, Message: fmt.Sprintf(format, args...)}}}
}

// Verify checks the model artifact at ref: its manifest is a gpupass
// model, an attestation referring to it is signed with Key, its statement
// is of PredicateType about exactly this manifest and names the model
// file's digest and size, and the model's bytes, downloaded, hash to that
// digest. A registry that cannot be reached or read is an error; anything
// it serves that does not check out is a failed layer.
func Verify(ctx context.Context, ref string, o VerifyOptions) (*Result, error) {
	limit := o.MaxBytes
	if limit <= 0 {
		limit = DefaultMaxModelBytes
	}
	if o.Key == nil && o.Identity == nil {
		return nil, errors.New("verifying a model: no public key or keyless identity given")
	}
	c, err := o.Registry.Open(ctx, ref, false)
	if err != nil {
		return nil, fmt.Errorf("reaching %s: %w", ref, err)
	}
	res := &Result{}
	raw, md, ct, err := c.Manifest(ctx, c.Ref)
	if err != nil {
		if errors.Is(err, bundle.ErrVerification) {
			res.add(fail(LayerArtifact, "manifest", "%v", err))
			res.skip(LayerAttestation, LayerSignature, LayerStatement, LayerModel)
			return res, nil
		}
		return nil, fmt.Errorf("fetching manifest of %s: %w", ref, bundle.Explain(err))
	}
	digest := c.Ref.Context().Digest(md.String())
	res.Reference, res.Digest = digest.String(), md.String()
	layer, l := checkArtifact(raw, ct)
	if !res.add(l) {
		res.skip(LayerAttestation, LayerSignature, LayerStatement, LayerModel)
		return res, nil
	}

	found, err := attestations(ctx, c, digest, res)
	if err != nil {
		return nil, err
	}
	if found == nil {
		res.skip(LayerSignature, LayerStatement, LayerModel)
		return res, nil
	}
	st, ok := verifySignature(ctx, found, audit.VerifyOptions{Key: o.Key, Identity: o.Identity}, md.Hex, res)
	if !ok {
		res.skip(LayerStatement, LayerModel)
		return res, nil
	}
	if !res.add(checkStatement(st, md.Hex, layer)) {
		res.skip(LayerModel)
		return res, nil
	}
	res.Predicate = &st.Predicate
	res.PredicateType = st.PredicateType
	l, err = checkModel(ctx, c, layer, limit, o.Out)
	if err != nil {
		return nil, err
	}
	if res.add(l) && o.Out != "" {
		res.Written = o.Out
	}
	res.OK = res.FailedLayer == ""
	return res, nil
}

// checkArtifact checks the manifest is a gpupass model: its artifactType,
// one layer of the model media type with a title.
func checkArtifact(raw []byte, contentType string) (v1.Descriptor, audit.Layer) {
	m, err := bundle.CheckManifest(raw, contentType)
	if err != nil {
		return v1.Descriptor{}, fail(LayerArtifact, "manifest", "%v", err)
	}
	if m.ArtifactType != ArtifactType {
		return v1.Descriptor{}, fail(LayerArtifact, "artifact-type", "artifactType %q, want %q: not a model gpupass pushed", m.ArtifactType, ArtifactType)
	}
	if len(m.Layers) != 1 || string(m.Layers[0].MediaType) != ModelMediaType {
		return v1.Descriptor{}, fail(LayerArtifact, "layers", "a model artifact holds one layer of %s, this one %d layer(s)", ModelMediaType, len(m.Layers))
	}
	d := m.Layers[0]
	if d.Digest.Algorithm != "sha256" {
		return v1.Descriptor{}, fail(LayerArtifact, "layers", "the model layer has a %s digest, want sha256", d.Digest.Algorithm)
	}
	return d, audit.Layer{Name: LayerArtifact, Detail: fmt.Sprintf("model %s, %d bytes, %s", d.Annotations[AnnotationTitle], d.Size, d.Digest)}
}

// candidate is a sigstore bundle attached to the model.
type candidate struct {
	ref    string
	bundle []byte
}

// attestations finds the sigstore bundles attached to digest whose
// predicate type cosign's annotation says is ours (or does not say), at
// most MaxReferrers, each read within MaxBundleBytes.
func attestations(ctx context.Context, c *bundle.Client, digest name.Digest, res *Result) ([]candidate, error) {
	idx, via, err := c.Referrers(ctx, digest)
	if err != nil {
		if errors.Is(err, bundle.ErrVerification) {
			res.add(fail(LayerAttestation, "referrers", "%v", err))
			return nil, nil
		}
		return nil, fmt.Errorf("listing referrers of %s: %w", digest, bundle.Explain(err))
	}
	var found []candidate
	var problems []audit.Problem
	seen := 0
	for _, d := range idx.Manifests {
		if d.ArtifactType != "" && d.ArtifactType != BundleMediaType && d.ArtifactType != bundle.EmptyMediaType {
			continue // an SBOM, a signature of another kind
		}
		if pt := d.Annotations[AnnotationBundlePredicateType]; pt != "" && pt != PredicateType {
			continue // another attestation
		}
		if seen++; seen > MaxReferrers {
			problems = append(problems, audit.Problem{Check: "referrers", Message: fmt.Sprintf("more than %d attestations attached; the rest were not read", MaxReferrers)})
			break
		}
		b, err := readBundle(ctx, c, digest, d.Digest)
		if err != nil {
			problems = append(problems, audit.Problem{File: d.Digest.String(), Check: "referrer", Message: err.Error()})
			continue
		}
		found = append(found, candidate{ref: digest.Context().Digest(d.Digest.String()).String(), bundle: b})
	}
	if len(found) == 0 {
		problems = append(problems, audit.Problem{Check: "present", Message: fmt.Sprintf("no sigstore bundle of predicate type %s refers to %s (looked up through the %s): push it with `gpupass model push`", PredicateType, digest.DigestStr(), via)})
		res.add(audit.Layer{Name: LayerAttestation, Problems: problems})
		return nil, nil
	}
	detail := fmt.Sprintf("%d sigstore bundle(s) found through the %s", len(found), via)
	for _, p := range problems {
		// Not a failure while another bundle is there to check; said,
		// since it is what an attacker's referrer looks like.
		detail += fmt.Sprintf("; skipped %s: %s", p.File, p.Message)
	}
	res.add(audit.Layer{Name: LayerAttestation, Detail: detail})
	return found, nil
}

// readBundle reads the referrer manifest at d and the sigstore bundle it
// holds, checking its subject is digest.
func readBundle(ctx context.Context, c *bundle.Client, subject name.Digest, d v1.Hash) ([]byte, error) {
	raw, _, ct, err := c.Manifest(ctx, subject.Context().Digest(d.String()))
	if err != nil {
		return nil, bundle.Explain(err)
	}
	m, err := bundle.CheckManifest(raw, ct)
	if err != nil {
		return nil, err
	}
	if m.Subject == nil || m.Subject.Digest.String() != subject.DigestStr() {
		return nil, fmt.Errorf("its subject is not %s", subject.DigestStr())
	}
	if len(m.Layers) != 1 || string(m.Layers[0].MediaType) != BundleMediaType {
		return nil, fmt.Errorf("not a sigstore bundle referrer (want one layer of %s)", BundleMediaType)
	}
	l := m.Layers[0]
	if l.Size > MaxBundleBytes {
		return nil, fmt.Errorf("the bundle is %d bytes, at most %d are read", l.Size, MaxBundleBytes)
	}
	rc, err := c.Blob(ctx, l)
	if err != nil {
		return nil, bundle.Explain(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxBundleBytes+1))
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(b); int64(len(b)) != l.Size || "sha256:"+hex.EncodeToString(sum[:]) != l.Digest.String() {
		return nil, fmt.Errorf("the bundle blob's bytes do not match its descriptor %s (%d bytes)", l.Digest, l.Size)
	}
	return b, nil
}

// verifySignature returns the statement of the first bundle that
// verifies with the key, or the keyless identity, for the manifest digest.
func verifySignature(ctx context.Context, found []candidate, vo audit.VerifyOptions, manifestHex string, res *Result) (Statement, bool) {
	var problems []audit.Problem
	for _, f := range found {
		payload, signer, err := audit.VerifyAttestation(ctx, f.bundle, vo, manifestHex)
		switch {
		case errors.Is(err, audit.ErrSignedKeyless):
			err = errors.New("the attestation was signed keyless (it carries a certificate): verify it against the identity that must have signed it, as in `gpupass model verify REF --certificate-identity ID --certificate-oidc-issuer URL`, not with a key")
		case errors.Is(err, audit.ErrSignedWithKey):
			err = errors.New("the attestation was signed with a key (it carries no certificate): verify it with that key's public half, as in `gpupass model verify REF --key cosign.pub`")
		}
		if err != nil {
			problems = append(problems, audit.Problem{File: f.ref, Check: "dsse-signature", Message: err.Error()})
			continue
		}
		var st Statement
		dec := json.NewDecoder(bytes.NewReader(payload))
		if err := dec.Decode(&st); err != nil {
			problems = append(problems, audit.Problem{File: f.ref, Check: "statement", Message: fmt.Sprintf("the DSSE payload is not an in-toto statement: %v", err)})
			continue
		}
		if st.PredicateType != PredicateType {
			problems = append(problems, audit.Problem{File: f.ref, Check: "predicate-type", Message: fmt.Sprintf("predicateType %q, want %q", st.PredicateType, PredicateType)})
			continue
		}
		res.Attestation = f.ref
		detail := "in-toto statement (DSSE) in " + f.ref + " verified with the given key"
		if signer != nil {
			res.SignedBy = signer
			detail = fmt.Sprintf("in-toto statement (DSSE) in %s verified keyless: certificate for %s from %s, logged and timestamped", f.ref, signer.Identity, signer.Issuer)
		}
		res.add(audit.Layer{Name: LayerSignature, Detail: detail})
		return st, true
	}
	res.add(audit.Layer{Name: LayerSignature, Problems: problems})
	return Statement{}, false
}

// checkStatement checks the signed statement is about this manifest and
// names the model layer's digest, size and title.
func checkStatement(st Statement, manifestHex string, layer v1.Descriptor) audit.Layer {
	b := audit.Layer{Name: LayerStatement}
	p := func(check, format string, args ...any) {
		b.Problems = append(b.Problems, audit.Problem{Check: check, Message: fmt.Sprintf(format, args...)})
	}
	if st.Type != audit.InTotoStatementType {
		p("statement-type", "_type %q, want %q", st.Type, audit.InTotoStatementType)
	}
	if len(st.Subject) != 1 || st.Subject[0].Digest["sha256"] != manifestHex {
		p("subject", "the statement's subject %v is not the model manifest sha256:%s", st.Subject, manifestHex)
	}
	m := st.Predicate.Model
	if "sha256:"+m.SHA256 != layer.Digest.String() || m.Size != layer.Size {
		p("model-digest", "the predicate names the model sha256:%s (%d bytes), the manifest's layer is %s (%d bytes)", m.SHA256, m.Size, layer.Digest, layer.Size)
	}
	if m.Name != layer.Annotations[AnnotationTitle] {
		p("model-name", "the predicate names the model %q, the manifest's layer %q", m.Name, layer.Annotations[AnnotationTitle])
	}
	if st.Predicate.Run.ID == "" {
		p("run", "the predicate names no run")
	}
	if len(b.Problems) == 0 {
		b.Detail = fmt.Sprintf("%s about this manifest: run %s, spec %s, %d node report(s)", PredicateType, st.Predicate.Run.ID, st.Predicate.SpecFingerprint, len(st.Predicate.Nodes))
	}
	return b
}

// checkModel downloads the model blob and checks its bytes against the
// digest and size the manifest (and the signed predicate) name: a registry
// whose storage was changed serves other bytes under the same digest.
func checkModel(ctx context.Context, c *bundle.Client, layer v1.Descriptor, limit int64, out string) (audit.Layer, error) {
	if layer.Size > limit {
		return fail(LayerModel, "size", "the model is %d bytes, over the %d this verify downloads: raise the limit to check it", layer.Size, limit), nil
	}
	rc, err := c.Blob(ctx, layer)
	if err != nil {
		if errors.Is(err, bundle.ErrVerification) {
			return fail(LayerModel, "bytes", "%v", err), nil
		}
		return audit.Layer{}, fmt.Errorf("downloading the model blob %s: %w", layer.Digest, bundle.Explain(err))
	}
	defer rc.Close()
	var w io.Writer = io.Discard
	var tmp *os.File
	if out != "" {
		if _, err := os.Lstat(out); err == nil {
			return audit.Layer{}, fmt.Errorf("writing the model: %s exists: name a new file", out)
		}
		tmp, err = os.CreateTemp(filepath.Dir(out), ".gpupass-model-*")
		if err != nil {
			return audit.Layer{}, fmt.Errorf("writing the model: %w", err)
		}
		defer func() {
			tmp.Close()
			os.Remove(tmp.Name())
		}()
		w = tmp
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, w), io.LimitReader(rc, layer.Size+1))
	if err != nil {
		return audit.Layer{}, fmt.Errorf("downloading the model blob %s: %w", layer.Digest, err)
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if n != layer.Size || got != layer.Digest.String() {
		return fail(LayerModel, "bytes", "the registry served %d bytes hashing to %s for the model blob %s (%d bytes): the stored model was changed", n, got, layer.Digest, layer.Size), nil
	}
	if tmp != nil {
		if err := tmp.Close(); err != nil {
			return audit.Layer{}, fmt.Errorf("writing the model: %w", err)
		}
		if err := os.Link(tmp.Name(), out); err != nil {
			return audit.Layer{}, fmt.Errorf("writing the model: %w", err)
		}
	}
	return audit.Layer{Name: LayerModel, Detail: fmt.Sprintf("downloaded %d bytes; they hash to %s, the signed digest", n, got)}, nil
}
