package audit

import (
	"encoding/json"
	"fmt"
)

// In-toto constants for the optional attestation.
const (
	InTotoPayloadType   = "application/vnd.in-toto+json"
	InTotoStatementType = "https://in-toto.io/Statement/v1"
	// PredicateType identifies gpupass's audit predicate.
	PredicateType = "https://gpupass.dev/attestations/audit/v1"
)

type statement struct {
	Type          string    `json:"_type"`
	Subject       []subject `json:"subject"`
	PredicateType string    `json:"predicateType"`
	Predicate     predicate `json:"predicate"`
}

type subject struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// predicate is what an auditor's policy engine reads without opening the
// zip: which run, which environment, whether it matched.
type predicate struct {
	AllocationID        string `json:"allocation_id"`
	GpupassVersion      string `json:"gpupass_version"`
	Simulated           bool   `json:"simulated"`
	DeclaredFingerprint string `json:"declared_fingerprint"`
	MeasuredFingerprint string `json:"measured_fingerprint"`
	Match               bool   `json:"match"`
	AgentID             string `json:"agent_id"`
}

// newStatement is the statement Statement encodes.
func newStatement(m Manifest, manifestSHA256 string, env Environment) statement {
	st := statement{
		Type:          InTotoStatementType,
		Subject:       []subject{{Name: FileManifest, Digest: map[string]string{"sha256": manifestSHA256}}},
		PredicateType: PredicateType,
		Predicate: predicate{
			AllocationID:        m.AllocationID,
			GpupassVersion:      m.GpupassVersion,
			Simulated:           m.Simulated,
			DeclaredFingerprint: env.Declared.Fingerprint,
			MeasuredFingerprint: env.Measured.Fingerprint,
			Match:               env.Certified(),
			AgentID:             env.Measured.AgentID,
		},
	}
	for _, f := range m.Files {
		st.Subject = append(st.Subject, subject{Name: f.Name, Digest: map[string]string{"sha256": f.SHA256}})
	}
	return st
}

// Statement returns the in-toto statement of a report: manifest.json and
// every file it lists are the subjects.
func Statement(m Manifest, manifestSHA256 string, env Environment) ([]byte, error) {
	st := newStatement(m, manifestSHA256, env)
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encoding in-toto statement: %w", err)
	}
	return b, nil
}
