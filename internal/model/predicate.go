// Package model pushes a trained model (a run's checkpoint, or a file) to
// an OCI registry as an artifact and attaches a signed in-toto attestation
// of gpupass's model-provenance predicate to it, and verifies both: the
// attestation's signature, predicate and subject, and the model's bytes
// against their digest (which cosign does not fetch).
//
// The attestation is stored as cosign stores one (`cosign attest
// --new-bundle-format`): a sigstore bundle in a referrer manifest whose
// subject is the model's manifest, found through the registry's OCI 1.1
// referrers API or, on a registry without it, the sha256-<hex> tag. The
// registry client is internal/bundle's; signing goes through
// audit.Signer. The package prints nothing.
package model

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"

	"github.com/gpupass/gpupass/internal/audit"
)

// PredicateType identifies gpupass's model-provenance predicate; its JSON
// schema is docs/model-provenance.schema.json. Like the audit's
// (audit.PredicateType), it is a URI under https://gpupass.dev/attestations/.
const PredicateType = "https://gpupass.dev/attestations/model/v1"

// Media types of a model artifact.
const (
	// ArtifactType is the model manifest's artifactType.
	ArtifactType = "application/vnd.gpupass.model.v1"
	// ModelMediaType is the model file's layer: its bytes as written
	// (a PyTorch checkpoint, safetensors, …), uncompressed.
	ModelMediaType = "application/vnd.gpupass.model.file.v1"
	// BundleMediaType is cosign's media type of a sigstore bundle
	// referrer (artifactType and layer), version 0.3.
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
)

// Annotations of a model manifest and its attestation referrer.
const (
	AnnotationTitle       = "org.opencontainers.image.title"
	AnnotationCreated     = "org.opencontainers.image.created"
	AnnotationRun         = "dev.gpupass.run.id"
	AnnotationGroup       = "dev.gpupass.run.group"
	AnnotationFingerprint = "dev.gpupass.spec.fingerprint"
	// The annotations cosign writes on a bundle referrer and reads to
	// list attestations by predicate type.
	AnnotationBundleContent       = "dev.sigstore.bundle.content"
	AnnotationBundlePredicateType = "dev.sigstore.bundle.predicateType"
)

// Model sources (Predicate.Model.Source).
const (
	// SourceCheckpoint: the run's newest checkpoint as the broker holds
	// it, shipped by the node that ran it.
	SourceCheckpoint = "run-checkpoint"
	// SourceFile: a file the pusher named. When its digest equals a
	// checkpoint the run shipped, the source is SourceCheckpoint.
	SourceFile = "file"
)

// Predicate is gpupass's model-provenance predicate: which run made the
// model, in which declared environment, proved by which signed node
// reports, from which commit, with which final metrics.
type Predicate struct {
	// SpecFingerprint is the fingerprint of the run's declared spec.
	SpecFingerprint string `json:"spec_fingerprint"`
	Run             Run    `json:"run"`
	// Nodes are the nodes that ran it, each with the digest of the run
	// report it signed (today one node per run).
	Nodes []Node `json:"nodes"`
	// Commit is the commit the run was trained from, when known.
	Commit  *Commit  `json:"commit,omitempty"`
	Metrics *Metrics `json:"metrics,omitempty"`
	// Audit is the run's audit report zip, when one was given.
	Audit *File `json:"audit,omitempty"`
	Model Model `json:"model"`
	// Simulated: a node measured a simulated hardware profile; the
	// provenance proves nothing about real hardware.
	Simulated      bool   `json:"simulated"`
	GpupassVersion string `json:"gpupass_version"`
}

// Run names the run.
type Run struct {
	ID     string `json:"id"`
	Group  string `json:"group,omitempty"`
	Region string `json:"region,omitempty"`
	State  string `json:"state"`
}

// Node is one node of the run and the run report it signed.
type Node struct {
	NodeID string `json:"node_id"`
	// RunReportSHA256 is the sha256 of the signed conformance report,
	// byte for byte as the agent signed it (what the audit zip holds as
	// conformance-report.json).
	RunReportSHA256 string `json:"run_report_sha256"`
	// AgentKeySHA256 is the sha256 of the agent's PKIX public key (DER)
	// the report verifies with.
	AgentKeySHA256 string `json:"agent_key_sha256"`
	// RuntimeFingerprint is the fingerprint the node measured.
	RuntimeFingerprint string `json:"runtime_fingerprint"`
}

// Commit is the source commit.
type Commit struct {
	SHA        string `json:"sha"`
	Repository string `json:"repository,omitempty"`
	// Source says where the commit came from: "ci" (the CI job's own
	// variables, GITHUB_SHA or CI_COMMIT_SHA) or "flag" (--commit).
	Source string `json:"source"`
}

// Metrics are the run's last logged step and each metric's value there
// (the last value logged for a metric missing at that step).
type Metrics struct {
	LastStep int64              `json:"last_step"`
	Values   map[string]float64 `json:"values"`
}

// File is a file by name, digest and size.
type File struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Model is the pushed model file.
type Model struct {
	File
	// Source is SourceCheckpoint or SourceFile.
	Source string `json:"source"`
}

// Statement is an in-toto v1 statement of a model predicate.
type Statement struct {
	Type          string    `json:"_type"`
	Subject       []Subject `json:"subject"`
	PredicateType string    `json:"predicateType"`
	Predicate     Predicate `json:"predicate"`
}

// Subject is an in-toto subject.
type Subject struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// NewStatement is the statement about the model manifest of repository
// repo (REGISTRY/REPOSITORY, the name cosign gives the subject) with
// digest manifestSHA256 (hex).
func NewStatement(repo, manifestSHA256 string, p Predicate) Statement {
	if p.Nodes == nil {
		p.Nodes = []Node{}
	}
	return Statement{
		Type:          audit.InTotoStatementType,
		Subject:       []Subject{{Name: repo, Digest: map[string]string{"sha256": manifestSHA256}}},
		PredicateType: PredicateType,
		Predicate:     p,
	}
}

// Marshal encodes the statement as the DSSE payload.
func (s Statement) Marshal() ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding in-toto statement: %w", err)
	}
	return b, nil
}

// FinalMetrics returns the last step of points and each metric's last
// logged finite value; nil when there are none.
func FinalMetrics(points []MetricPoint) *Metrics {
	if len(points) == 0 {
		return nil
	}
	sorted := append([]MetricPoint(nil), points...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Step < sorted[j].Step })
	m := &Metrics{Values: map[string]float64{}}
	for _, p := range sorted {
		m.LastStep = max(m.LastStep, p.Step)
		for k, v := range p.Values {
			// JSON has no NaN or Inf: a metric's last finite value.
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				m.Values[k] = v
			}
		}
	}
	return m
}

// MetricPoint is one step's values, as the broker's GetMetrics returns
// them.
type MetricPoint struct {
	Step   int64
	Values map[string]float64
}
