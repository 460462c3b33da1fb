package audit

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	sgbundle "github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/fulcio/certificate"
	"github.com/sigstore/sigstore-go/pkg/root"
	sgverify "github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Verification layers, in the order they are checked.
const (
	LayerArchive   = "archive"
	LayerSignature = "signature"
	// LayerSigner: who signed a keyless report, from its certificate.
	LayerSigner      = "signer"
	LayerManifest    = "manifest"
	LayerAgent       = "agent-signature"
	LayerFingerprint = "fingerprint"
	// LayerLog: the run's log was complete and undisputed when audited.
	LayerLog         = "log"
	LayerAttestation = "attestation"
)

// MinimalTrustedRoot is an empty sigstore trusted root. Key-based bundles
// need no Fulcio or Rekor material, but cosign's new-bundle verification
// insists on a trusted root: `cosign verify-blob --trusted-root` takes
// this file.
const MinimalTrustedRoot = `{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}`

// AgentKey is an agent public key the verifier trusts, valid for reports
// generated between NotBefore and NotAfter (zero: unbounded).
type AgentKey struct {
	PEM       []byte
	NotBefore time.Time
	NotAfter  time.Time
}

// Identity is the keyless signer a report must have been signed by:
// cosign's --certificate-identity[-regexp] and --certificate-oidc-issuer
// [-regexp], checked against a trusted root.
type Identity struct {
	TrustedRoot root.TrustedMaterial
	// SAN or SANRegexp is the certificate's identity (a CI job's
	// workflow or pipeline URL); Issuer or IssuerRegexp its OIDC issuer.
	SAN, SANRegexp       string
	Issuer, IssuerRegexp string
}

// SignedBy is who signed a keyless report: the certificate's subject and
// the Fulcio extensions a CI provider's token filled in.
type SignedBy struct {
	Identity   string `json:"identity"`
	Issuer     string `json:"issuer"`
	Repository string `json:"repository,omitempty"`
	// Workflow is the pipeline definition that ran (GitHub's workflow
	// file at a ref, GitLab's .gitlab-ci.yml).
	Workflow string `json:"workflow,omitempty"`
	Ref      string `json:"ref,omitempty"`
	Commit   string `json:"commit,omitempty"`
	Trigger  string `json:"trigger,omitempty"`
	Run      string `json:"run,omitempty"`
	// SignedAt is the verified signed timestamp.
	SignedAt time.Time `json:"signed_at"`
}

// VerifyOptions control Verify.
type VerifyOptions struct {
	// Key is the cosign public key the manifest must be signed with.
	Key crypto.PublicKey
	// Identity accepts a report signed keyless by that identity. With
	// Key too, either signature is accepted; the report says which.
	Identity *Identity
	// AgentKeys pin the agent keys accepted for the conformance report.
	// Empty: the key inside the report is used, and the layer warns
	// (StatusWarn: whoever made the report chose that key), or fails
	// with RequirePinned (the CLI refuses an --agent-key file that lists
	// no key).
	AgentKeys []AgentKey
	// RequirePinned fails the agent-signature layer when AgentKeys is
	// empty instead of warning.
	RequirePinned bool
	// Fingerprint, when set, recomputes the declared fingerprint from the
	// declared spec source (spec.Parse + spec.Fingerprint), so a report
	// cannot pair a spec with another spec's fingerprint.
	Fingerprint func(file string, source []byte) (string, error)
	Limits      Limits
}

// Result is the outcome of Verify, layer by layer. OK is true when no
// layer failed or was skipped; a layer that warns (an agent key that was
// not pinned) leaves it true and is listed in Warnings.
type Result struct {
	OK           bool   `json:"ok"`
	FailedLayer  string `json:"failed_layer,omitempty"`
	AllocationID string `json:"allocation_id,omitempty"`
	Simulated    bool   `json:"simulated"`
	// AgentKeyPinned: the conformance report was checked against a key
	// the verifier gave (--agent-key), not only the one inside it.
	AgentKeyPinned bool `json:"agent_key_pinned"`
	// Group is the signed manifest's run group (audit GROUP), read only
	// when the report verified.
	Group *ManifestGroup `json:"group,omitempty"`
	// Signer is who signed a keyless report (nil: signed with a key).
	Signer   *SignedBy `json:"signer,omitempty"`
	Warnings []string  `json:"warnings,omitempty"`
	Layers   []Layer   `json:"layers"`
}

// A layer's status.
const (
	StatusOK   = "ok"
	StatusWarn = "warn"
	StatusFail = "fail"
	// StatusSkipped: the layer was not checked because a file it reads
	// failed the manifest check; what it would say would be about
	// contents nobody signed.
	StatusSkipped = "skipped"
)

// Layer is one verification step. OK is true for StatusOK and
// StatusWarn.
type Layer struct {
	Name     string    `json:"layer"`
	OK       bool      `json:"ok"`
	Status   string    `json:"status"`
	Detail   string    `json:"detail,omitempty"`
	Problems []Problem `json:"problems,omitempty"`
	// warning, when set and no problem was found, makes the layer
	// StatusWarn with this as its entry in Result.Warnings.
	warning string
}

// Problem is one failed check, naming the file it concerns.
type Problem struct {
	File    string `json:"file,omitempty"`
	Check   string `json:"check"`
	Message string `json:"message"`
}

type layerBuilder struct{ l Layer }

func (b *layerBuilder) fail(file, check, format string, args ...any) {
	b.l.Problems = append(b.l.Problems, Problem{File: file, Check: check, Message: fmt.Sprintf(format, args...)})
}

// VerifyFile reads and verifies an audit report zip.
func VerifyFile(ctx context.Context, path string, opts VerifyOptions) (*Result, error) {
	lim := opts.Limits
	if lim == (Limits{}) {
		lim = DefaultLimits
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading audit report: %w", err)
	}
	// The compressed archive cannot legitimately exceed the inflated
	// total, so refuse to read more than that.
	if fi.Size() > lim.MaxTotal {
		return &Result{FailedLayer: LayerArchive, Layers: []Layer{{Name: LayerArchive, Status: StatusFail, Problems: []Problem{{File: path, Check: "size", Message: fmt.Sprintf("%d bytes, at most %d allowed", fi.Size(), lim.MaxTotal)}}}}}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading audit report: %w", err)
	}
	return Verify(ctx, b, opts), nil
}

// Verify checks every layer of an audit report and never panics on
// hostile input: it reports what failed instead.
func Verify(ctx context.Context, zipBytes []byte, opts VerifyOptions) *Result {
	lim := opts.Limits
	if lim == (Limits{}) {
		lim = DefaultLimits
	}
	res := &Result{}
	files, _, err := readZip(zipBytes, lim)
	if err != nil {
		res.Layers = append(res.Layers, Layer{Name: LayerArchive, Status: StatusFail, Problems: []Problem{{Check: "safe-archive", Message: err.Error()}}})
		res.FailedLayer = LayerArchive
		return res
	}
	res.Layers = append(res.Layers, Layer{Name: LayerArchive, OK: true, Detail: fmt.Sprintf("%d entries, names and sizes safe", len(files))})

	manifestBytes := files[FileManifest]
	var m Manifest
	manifestErr := errors.New("missing")
	if manifestBytes != nil {
		dec := json.NewDecoder(bytes.NewReader(manifestBytes))
		dec.DisallowUnknownFields()
		manifestErr = dec.Decode(&m)
	}
	res.AllocationID = m.AllocationID
	res.Simulated = m.Simulated

	manifest := verifyManifest(files, m, manifestErr)
	// A layer that reads a file the manifest check failed is not run:
	// the file is not the one that was signed.
	failed := map[string]bool{}
	for _, p := range manifest.Problems {
		if p.File != "" {
			failed[p.File] = true
		}
	}
	checked := func(name string, deps []string, verify func() Layer) Layer {
		if manifestErr != nil {
			return Layer{Name: name, Status: StatusSkipped, Detail: fmt.Sprintf("not checked: %s cannot be read, so none of the files it reads is verified", FileManifest)}
		}
		for _, f := range deps {
			if failed[f] {
				return Layer{Name: name, Status: StatusSkipped, Detail: fmt.Sprintf("not checked: it reads %s, which failed the manifest check", f)}
			}
		}
		return verify()
	}
	sig, signer := verifySignature(ctx, files, opts)
	res.Layers = append(res.Layers, sig)
	if signer != nil {
		res.Signer = signer
		res.Layers = append(res.Layers, signerLayer(signer))
	}
	res.Layers = append(res.Layers,
		manifest,
		checked(LayerAgent, []string{FileConformanceReport, FileConformanceSig, FileAgentKey}, func() Layer {
			return verifyAgent(files, opts.AgentKeys, opts.RequirePinned)
		}),
		checked(LayerFingerprint, []string{FileEnvironment, FileConformanceReport}, func() Layer {
			return verifyFingerprint(files, m.AllocationID, opts.Fingerprint)
		}),
		checked(LayerLog, []string{FileRunSummary}, func() Layer { return verifyLog(files) }),
	)
	// A run across several nodes: a layer per rank, each proving that
	// node ran the declared environment.
	var env Environment
	if manifestErr == nil && json.Unmarshal(files[FileEnvironment], &env) == nil {
		for rank := 1; rank < gangNodes(env); rank++ {
			rf, sf, kf := RankFiles(rank)
			res.Layers = append(res.Layers, checked(LayerRank(rank), []string{FileEnvironment, FileConformanceReport, rf, sf, kf}, func() Layer {
				return verifyRank(files, m, env, rank, opts.AgentKeys, opts.RequirePinned)
			}))
		}
	}
	if _, ok := files[FileAttestation]; ok {
		res.Layers = append(res.Layers, checked(LayerAttestation, []string{FileManifest, FileEnvironment}, func() Layer {
			return verifyAttestation(ctx, files, opts, signer, m, manifestErr)
		}))
	}
	res.AgentKeyPinned = len(opts.AgentKeys) > 0
	res.OK = true
	for i := range res.Layers {
		l := &res.Layers[i]
		switch {
		case l.Status == StatusSkipped:
		case len(l.Problems) > 0:
			l.Status = StatusFail
		case l.warning != "":
			l.Status = StatusWarn
			res.Warnings = append(res.Warnings, l.warning)
		default:
			l.Status = StatusOK
		}
		l.OK = l.Status == StatusOK || l.Status == StatusWarn
		if !l.OK && res.OK {
			res.OK = false
			res.FailedLayer = l.Name
		}
	}
	if res.OK {
		// Signed: the set's verifier may rely on it.
		res.Group = m.Group
	}
	return res
}

func verifySignature(ctx context.Context, files map[string][]byte, opts VerifyOptions) (Layer, *SignedBy) {
	b := &layerBuilder{l: Layer{Name: LayerSignature}}
	mb, ok := files[FileManifest]
	if !ok {
		b.fail(FileManifest, "present", "the report has no %s", FileManifest)
		return b.l, nil
	}
	bb, ok := files[FileManifestBundle]
	if !ok {
		b.fail(FileManifestBundle, "present", "the report has no cosign bundle %s", FileManifestBundle)
		return b.l, nil
	}
	_, signer, err := verifyBundle(ctx, bb, opts, sgverify.WithArtifact(bytes.NewReader(mb)))
	if err != nil {
		b.fail(FileManifestBundle, "cosign-signature", "the signature over %s does not verify: %v", FileManifest, err)
		return b.l, nil
	}
	if signer != nil {
		b.l.Detail = fmt.Sprintf("cosign bundle over %s verified keyless: certificate for %s from %s, logged, signed timestamp %s", FileManifest, signer.Identity, signer.Issuer, signer.SignedAt.UTC().Format(time.RFC3339))
		return b.l, signer
	}
	b.l.Detail = fmt.Sprintf("cosign bundle over %s verified with the given key", FileManifest)
	return b.l, nil
}

// signerLayer says who signed a keyless report.
func signerLayer(s *SignedBy) Layer {
	var parts []string
	for _, f := range []struct{ name, v string }{
		{"repository", s.Repository}, {"workflow", s.Workflow}, {"ref", s.Ref}, {"commit", s.Commit},
		{"trigger", s.Trigger}, {"run", s.Run},
	} {
		if f.v != "" {
			parts = append(parts, f.name+" "+f.v)
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "identity "+s.Identity)
	}
	return Layer{Name: LayerSigner, Detail: strings.Join(parts, ", ")}
}

// ErrSignedKeyless and ErrSignedWithKey say that a bundle was signed the
// other way than the verifier can check.
var (
	ErrSignedKeyless = errors.New("the bundle was signed keyless (it carries a certificate): check it against the identity that must have signed it, as in `gpupass audit verify --certificate-identity ID --certificate-oidc-issuer URL`")
	ErrSignedWithKey = errors.New("the bundle was signed with a key (it carries no certificate): check it against that key's public half, as in `gpupass audit verify --key cosign.pub`")
)

// verifyBundle checks a sigstore bundle as `cosign verify-blob` does: a
// key-based one as with --key K --insecure-ignore-tlog, a keyless one as
// with --certificate-identity … --certificate-oidc-issuer …
// --trusted-root … --use-signed-timestamps. It returns the bundle, so that
// the caller can check what it carries, and for a keyless one who signed.
func verifyBundle(ctx context.Context, bundleJSON []byte, opts VerifyOptions, artifact sgverify.ArtifactPolicyOption) (*sgbundle.Bundle, *SignedBy, error) {
	var bd sgbundle.Bundle
	if err := bd.UnmarshalJSON(bundleJSON); err != nil {
		return nil, nil, fmt.Errorf("not a sigstore bundle: %w", err)
	}
	vc, err := bd.VerificationContent()
	if err != nil {
		return nil, nil, fmt.Errorf("the bundle's verification material: %w", err)
	}
	if vc.Certificate() != nil {
		if opts.Identity == nil {
			return nil, nil, ErrSignedKeyless
		}
		signer, err := verifyKeyless(ctx, &bd, *opts.Identity, artifact)
		return &bd, signer, err
	}
	if opts.Key == nil {
		return nil, nil, ErrSignedWithKey
	}
	v, err := signature.LoadVerifier(opts.Key, crypto.SHA256)
	if err != nil {
		return nil, nil, fmt.Errorf("loading public key: %w", err)
	}
	tr, err := root.NewTrustedRootFromJSON([]byte(MinimalTrustedRoot))
	if err != nil {
		return nil, nil, fmt.Errorf("trusted root: %w", err)
	}
	co := &cosign.CheckOpts{SigVerifier: v, IgnoreTlog: true, TrustedMaterial: tr, NewBundleFormat: true}
	if _, err := cosign.VerifyNewBundle(ctx, co, artifact, &bd); err != nil {
		return nil, nil, err
	}
	return &bd, nil, nil
}

func verifyKeyless(ctx context.Context, bd *sgbundle.Bundle, id Identity, artifact sgverify.ArtifactPolicyOption) (*SignedBy, error) {
	if id.TrustedRoot == nil {
		return nil, errors.New("no trusted root to check the certificate against")
	}
	// cosign verify-blob's own checks: an embedded SCT, a transparency
	// log entry and, since Rekor v2 states no time, a signed timestamp.
	co := &cosign.CheckOpts{
		TrustedMaterial: id.TrustedRoot, NewBundleFormat: true, UseSignedTimestamps: true,
		Identities: []cosign.Identity{{Subject: id.SAN, SubjectRegExp: id.SANRegexp, Issuer: id.Issuer, IssuerRegExp: id.IssuerRegexp}},
	}
	res, err := cosign.VerifyNewBundle(ctx, co, artifact, bd)
	if err != nil {
		// Say who did sign: what the verifier needs to tell a
		// mistyped identity from a report signed by someone else.
		var idErr *sgverify.ErrNoMatchingCertificateIdentity
		if vc, verr := bd.VerificationContent(); errors.As(err, &idErr) && verr == nil && vc.Certificate() != nil {
			if sum, serr := certificate.SummarizeCertificate(vc.Certificate()); serr == nil {
				return nil, fmt.Errorf("the certificate is for %s from issuer %s, not the identity given: %w", sum.SubjectAlternativeName, sum.Extensions.Issuer, err)
			}
		}
		// A log entry, a CT proof, a timestamp or a CA the trusted
		// root does not know: most often another instance's root.
		for _, what := range []string{"log inclusion", "signed certificate timestamp", "timestamps", "certificate chain", "leaf certificate"} {
			if strings.Contains(err.Error(), what) {
				return nil, fmt.Errorf("%w (is the trusted root that of the Sigstore instance that signed it? it must hold the Fulcio, transparency log, CT log and timestamp authority that did)", err)
			}
		}
		return nil, err
	}
	if res.Signature == nil || res.Signature.Certificate == nil {
		return nil, errors.New("verified, but no certificate in the result")
	}
	c := res.Signature.Certificate
	s := &SignedBy{
		Identity: c.SubjectAlternativeName, Issuer: c.Extensions.Issuer, Repository: c.Extensions.SourceRepositoryURI,
		Workflow: c.Extensions.BuildConfigURI, Ref: c.Extensions.SourceRepositoryRef, Commit: c.Extensions.SourceRepositoryDigest,
		Trigger: c.Extensions.BuildTrigger, Run: c.Extensions.RunInvocationURI,
	}
	for _, ts := range res.VerifiedTimestamps {
		if ts.Type == "TimestampAuthority" || s.SignedAt.IsZero() {
			s.SignedAt = ts.Timestamp
		}
	}
	return s, nil
}

var required = []string{FileEnvironment, FileConformanceReport, FileConformanceSig, FileAgentKey, FileConformanceLog, FileHardware, FileRunSummary}

func verifyManifest(files map[string][]byte, m Manifest, manifestErr error) Layer {
	b := &layerBuilder{l: Layer{Name: LayerManifest}}
	if manifestErr != nil {
		b.fail(FileManifest, "parse", "cannot read %s: %v", FileManifest, manifestErr)
		return b.l
	}
	if m.ManifestVersion != ManifestVersion {
		b.fail(FileManifest, "version", "manifest_version %d, want %d", m.ManifestVersion, ManifestVersion)
	}
	listed := map[string]bool{}
	for _, f := range m.Files {
		if listed[f.Name] {
			b.fail(f.Name, "listed-once", "listed twice in the manifest")
			continue
		}
		listed[f.Name] = true
		data, ok := files[f.Name]
		if !ok {
			b.fail(f.Name, "present", "listed in the manifest but missing from the report")
			continue
		}
		if int64(len(data)) != f.Size {
			b.fail(f.Name, "size", "is %d bytes, the manifest says %d", len(data), f.Size)
		}
		d := sha256.Sum256(data)
		if got := hex.EncodeToString(d[:]); got != f.SHA256 {
			b.fail(f.Name, "sha256", "sha256 %s, the manifest says %s: the file was changed", got, f.SHA256)
		}
	}
	for _, name := range required {
		if !listed[name] {
			b.fail(name, "listed", "required file is not in the manifest")
		}
	}
	var extra []string
	for name := range files {
		switch name {
		case FileManifest, FileManifestBundle, FileAttestation:
			continue
		}
		if !listed[name] {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	for _, name := range extra {
		b.fail(name, "unlisted", "file is in the report but not in the manifest (added after signing)")
	}
	if rb, ok := files[FileConformanceReport]; ok && !m.Simulated {
		if r, err := conformance.Parse(rb); err == nil && r.Simulated {
			b.fail(FileManifest, "simulated", "the manifest says simulated=false but the signed conformance report is simulated")
		}
	}
	if len(b.l.Problems) == 0 {
		b.l.Detail = fmt.Sprintf("%d files match the manifest; no missing or extra files", len(m.Files))
	}
	return b.l
}

func verifyAgent(files map[string][]byte, pinned []AgentKey, requirePinned bool) Layer {
	return verifyAgentFiles(LayerAgent, files, FileConformanceReport, FileConformanceSig, FileAgentKey, pinned, requirePinned)
}

// verifyAgentFiles is verifyAgent over the named report, signature and
// key files (rank 0's, or a rank's of a gang).
func verifyAgentFiles(layer string, files map[string][]byte, reportName, sigName, keyName string, pinned []AgentKey, requirePinned bool) Layer {
	b := &layerBuilder{l: Layer{Name: layer}}
	report, okR := files[reportName]
	sig, okS := files[sigName]
	embedded, okK := files[keyName]
	for name, ok := range map[string]bool{reportName: okR, sigName: okS, keyName: okK} {
		if !ok {
			b.fail(name, "present", "missing from the report")
		}
	}
	if len(b.l.Problems) > 0 {
		sort.Slice(b.l.Problems, func(i, j int) bool { return b.l.Problems[i].File < b.l.Problems[j].File })
		return b.l
	}
	embPub, err := conformance.ParsePublicKey(embedded)
	if err != nil {
		b.fail(keyName, "agent-key", "%v", err)
		return b.l
	}
	useKey := embedded
	if len(pinned) == 0 && requirePinned {
		b.fail(keyName, "known-agent-key", "no agent key was pinned and pinning is required: pass --agent-key with the node's public key (agent.pub in the agent's state dir) or the broker's key list")
		return b.l
	}
	if len(pinned) > 0 {
		var match *AgentKey
		embDER, _ := x509.MarshalPKIXPublicKey(embPub)
		for i := range pinned {
			p, err := conformance.ParsePublicKey(pinned[i].PEM)
			if err != nil {
				continue
			}
			der, _ := x509.MarshalPKIXPublicKey(p)
			if bytes.Equal(der, embDER) {
				match = &pinned[i]
				break
			}
		}
		if match == nil {
			b.fail(keyName, "known-agent-key", "the report was signed by an unknown agent key (not one of the --agent-key keys)")
			return b.l
		}
		useKey = match.PEM
		if r, err := conformance.Parse(report); err == nil {
			at, err := time.Parse(time.RFC3339Nano, r.GeneratedAt)
			switch {
			case err != nil:
				b.fail(reportName, "generated_at", "generated_at %q is not RFC 3339: %v", r.GeneratedAt, err)
			case !match.NotAfter.IsZero() && at.After(match.NotAfter):
				b.fail(keyName, "agent-key-validity", "the agent key expired at %s, before the report was generated at %s", match.NotAfter.UTC().Format(time.RFC3339), r.GeneratedAt)
			case !match.NotBefore.IsZero() && at.Before(match.NotBefore):
				b.fail(keyName, "agent-key-validity", "the agent key is valid from %s, after the report was generated at %s", match.NotBefore.UTC().Format(time.RFC3339), r.GeneratedAt)
			}
		}
	}
	if err := conformance.Verify(useKey, report, string(sig)); err != nil {
		b.fail(reportName, "agent-signature", "the agent signature in %s does not verify over %s: %v", sigName, reportName, err)
	}
	if len(b.l.Problems) == 0 {
		if len(pinned) > 0 {
			b.l.Detail = "conformance report signed by a pinned agent key"
		} else {
			// Only the manifest's signer vouches for that key: whoever
			// holds the cosign key could have made the report and the
			// key together.
			b.l.Detail = "unpinned: the conformance report verifies only against the agent key inside the report, which whoever built the report chose; pin the node's key with --agent-key agent.pub (or --require-pinned to fail without one)"
			b.l.warning = "unpinned: the agent key was not pinned (--agent-key)"
		}
	}
	return b.l
}

func verifyFingerprint(files map[string][]byte, allocID string, recompute func(string, []byte) (string, error)) Layer {
	b := &layerBuilder{l: Layer{Name: LayerFingerprint}}
	var env Environment
	eb, ok := files[FileEnvironment]
	if !ok {
		b.fail(FileEnvironment, "present", "missing from the report")
		return b.l
	}
	if err := json.Unmarshal(eb, &env); err != nil {
		b.fail(FileEnvironment, "parse", "%v", err)
		return b.l
	}
	r, err := conformance.Parse(files[FileConformanceReport])
	if err != nil {
		b.fail(FileConformanceReport, "parse", "%v", err)
		return b.l
	}
	switch {
	case env.Declared.Fingerprint == "":
		b.fail(FileEnvironment, "declared-fingerprint", "declared.fingerprint is empty")
	case r.RuntimeFingerprint == "":
		b.fail(FileConformanceReport, "runtime_fingerprint", "the signed conformance report carries no runtime_fingerprint")
	case r.RuntimeFingerprint != env.Declared.Fingerprint:
		b.fail(FileConformanceReport, "fingerprint-match", "the measured fingerprint %s in the signed report differs from the declared %s: the run did not use the declared environment", r.RuntimeFingerprint, env.Declared.Fingerprint)
	}
	// The report must be the run's own: bound to this allocation and
	// measured against the declared spec, so no other run's (or the
	// node's periodic) report can stand in for it.
	switch {
	case r.AllocationID == "":
		b.fail(FileConformanceReport, "run-report", "the signed report names no allocation: it is the node's periodic report, not one measured for this run")
	case r.AllocationID != allocID:
		b.fail(FileConformanceReport, "run-report", "the signed report was measured for allocation %s, the manifest is for %s", r.AllocationID, allocID)
	}
	if r.SpecFingerprint != "" && r.SpecFingerprint != env.Declared.Fingerprint {
		b.fail(FileConformanceReport, "spec-fingerprint", "the signed report was measured against spec %s, the declared spec is %s", r.SpecFingerprint, env.Declared.Fingerprint)
	}
	if env.Measured.Fingerprint != r.RuntimeFingerprint {
		b.fail(FileEnvironment, "measured-fingerprint", "measured.fingerprint %s differs from the signed report's %s", env.Measured.Fingerprint, r.RuntimeFingerprint)
	}
	if want := r.RuntimeFingerprint != "" && r.RuntimeFingerprint == env.Declared.Fingerprint; env.Match != want {
		b.fail(FileEnvironment, "match", "match is %v but the fingerprints say %v", env.Match, want)
	}
	recomputed := ""
	if recompute != nil {
		fp, err := recompute(env.Declared.File, []byte(env.Declared.Source))
		switch {
		case err != nil:
			b.fail(FileEnvironment, "declared-recomputed", "the declared spec does not parse: %v", err)
		case fp != env.Declared.Fingerprint:
			b.fail(FileEnvironment, "declared-recomputed", "the declared spec's fingerprint is %s, the report claims %s", fp, env.Declared.Fingerprint)
		default:
			recomputed = " (recomputed from the declared spec)"
		}
	}
	if len(b.l.Problems) == 0 {
		b.l.Detail = "the signed report's fingerprint " + r.RuntimeFingerprint + " matches the declared one" + recomputed
	}
	return b.l
}

// verifyLog fails a report whose run log was disputed (two records for
// one seq) or incomplete: the metrics summarised in it are then not
// proof of what the run logged.
func verifyLog(files map[string][]byte) Layer {
	b := &layerBuilder{l: Layer{Name: LayerLog}}
	sb, ok := files[FileRunSummary]
	if !ok {
		b.fail(FileRunSummary, "present", "missing from the report")
		return b.l
	}
	var sum RunSummary
	if err := json.Unmarshal(sb, &sum); err != nil {
		b.fail(FileRunSummary, "parse", "%v", err)
		return b.l
	}
	l := sum.Log
	switch {
	case l == nil:
		b.l.Detail = "the report records nothing about the log's integrity (built before gpupass recorded it)"
	case l.Complete != l.whole():
		b.fail(FileRunSummary, "log-complete", "log.complete is %v but held_through %d, last_seq %d and %d disputed record(s) say %v",
			l.Complete, l.HeldThrough, l.LastSeq, l.DisputedRecords, l.whole())
	case l.Problem() != "":
		b.fail(FileRunSummary, "log-complete", "%s", l.Problem())
	default:
		b.l.Detail = fmt.Sprintf("the broker held the whole log (seqs 1..%d), no record disputed", l.HeldThrough)
	}
	return b.l
}

func verifyAttestation(ctx context.Context, files map[string][]byte, opts VerifyOptions, manifestSigner *SignedBy, m Manifest, manifestErr error) Layer {
	b := &layerBuilder{l: Layer{Name: LayerAttestation}}
	d := sha256.Sum256(files[FileManifest])
	bd, signer, err := verifyBundle(ctx, files[FileAttestation], opts, sgverify.WithArtifactDigest("sha256", d[:]))
	if err != nil {
		b.fail(FileAttestation, "dsse-signature", "the in-toto attestation does not verify for %s: %v", FileManifest, err)
		return b.l
	}
	// Both signed the same way: a report whose manifest a key signed
	// cannot carry an attestation by some CI identity, or the reverse.
	if (signer == nil) != (manifestSigner == nil) || (signer != nil && (signer.Identity != manifestSigner.Identity || signer.Issuer != manifestSigner.Issuer)) {
		b.fail(FileAttestation, "same-signer", "the attestation and %s were not signed by the same key or identity", FileManifestBundle)
		return b.l
	}
	// A plain message signature over the manifest digest verifies just
	// as well (manifest.sigstore.json is one), but states nothing: only
	// a DSSE envelope carries the statement that policy engines read.
	env := bd.GetDsseEnvelope()
	if env == nil {
		b.fail(FileAttestation, "dsse-envelope", "the bundle is a plain message signature, not a DSSE envelope around an in-toto statement")
		return b.l
	}
	if env.GetPayloadType() != InTotoPayloadType {
		b.fail(FileAttestation, "dsse-envelope", "the DSSE payload type is %q, want %q", env.GetPayloadType(), InTotoPayloadType)
		return b.l
	}
	var got statement
	if err := json.Unmarshal(env.GetPayload(), &got); err != nil {
		b.fail(FileAttestation, "statement", "the DSSE payload is not an in-toto statement: %v", err)
		return b.l
	}
	want, ok := expectedStatement(b, files, m, manifestErr, hex.EncodeToString(d[:]))
	if !ok {
		return b.l
	}
	checkStatement(b, got, want)
	if len(b.l.Problems) == 0 {
		b.l.Detail = "in-toto statement (DSSE) verified; its subjects and predicate match " + FileManifest + " and " + FileEnvironment
	}
	return b.l
}

// expectedStatement is the statement Build would have signed for this
// report's manifest and environment.
func expectedStatement(b *layerBuilder, files map[string][]byte, m Manifest, manifestErr error, manifestSHA256 string) (statement, bool) {
	if manifestErr != nil {
		b.fail(FileManifest, "statement", "cannot check the statement against %s: %v", FileManifest, manifestErr)
		return statement{}, false
	}
	var env Environment
	if err := json.Unmarshal(files[FileEnvironment], &env); err != nil {
		b.fail(FileEnvironment, "statement", "cannot check the statement against %s: %v", FileEnvironment, err)
		return statement{}, false
	}
	return newStatement(m, manifestSHA256, env), true
}

func checkStatement(b *layerBuilder, got, want statement) {
	if got.Type != want.Type {
		b.fail(FileAttestation, "statement-type", "_type %q, want %q", got.Type, want.Type)
	}
	if got.PredicateType != want.PredicateType {
		b.fail(FileAttestation, "predicate-type", "predicateType %q, want %q", got.PredicateType, want.PredicateType)
	}
	if !slices.EqualFunc(got.Subject, want.Subject, func(a, b subject) bool { return a.Name == b.Name && maps.Equal(a.Digest, b.Digest) }) {
		b.fail(FileAttestation, "subject", "the statement's subjects %v differ from the report's files %v", got.Subject, want.Subject)
	}
	// predicate holds scalars only: comparing the structs covers every
	// field, including any added later.
	if got.Predicate != want.Predicate {
		b.fail(FileAttestation, "predicate", "the predicate %+v differs from what the report says, %+v", got.Predicate, want.Predicate)
	}
}
