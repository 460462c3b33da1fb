// Package audit builds and verifies signed audit reports: a deterministic
// zip that proves which environment a finished run used, with a manifest
// signed as a cosign (sigstore) bundle that the stock `cosign verify-blob`
// accepts.
//
// It imports cosign and sigstore, so the agent must never import it (see
// internal/depcheck); the agent-side contract lives in internal/conformance.
package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/spec"
)

// Run is everything the audit needs about one finished run. The broker
// fills it from its record of the allocation; until the broker exists it
// is read from a JSON run record (FileSource).
type Run struct {
	AllocationID string `json:"allocation_id"`
	// State is the lifecycle state of the allocation. Only finished runs
	// (succeeded, failed, cancelled) can be audited.
	State      string    `json:"state"`
	Result     string    `json:"result"` // succeeded | failed | cancelled, with State
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Restarts   int       `json:"restarts"`
	// BundleDigest is the digest of the wheel bundle the job installed
	// (sha256:…), empty when the job did not use one.
	BundleDigest string `json:"bundle_digest,omitempty"`

	// SpecBytes are the declared spec as the user wrote it; Spec is its
	// parse. DeclaredFingerprint is spec.Fingerprint of it.
	SpecFile            string    `json:"spec_file,omitempty"`
	SpecBytes           string    `json:"spec_bytes"`
	Spec                spec.Spec `json:"spec"`
	DeclaredFingerprint string    `json:"declared_fingerprint"`

	// Conformance is the agent's signed report, byte for byte as signed.
	Conformance Evidence `json:"conformance"`
	// Ranks are the signed reports of ranks 1.. of a run across several
	// nodes (rank 0's is Conformance); empty for a one-node run.
	Ranks []RankEvidence `json:"ranks,omitempty"`

	// Hardware is the node's inventory. When empty it is taken from the
	// signed conformance report.
	Hardware *Hardware `json:"hardware,omitempty"`

	// Metrics are the run's metric points; MetricsSummary, when set,
	// is used as is instead of summarising Metrics.
	Metrics        []MetricPoint   `json:"metrics,omitempty"`
	MetricsSummary []MetricSummary `json:"metrics_summary,omitempty"`

	// Simulated is true when any part of the run came from a simulated
	// hardware profile (the conformance report's own flag is OR-ed in).
	Simulated bool `json:"simulated"`

	// Log is what the broker held of the run's log; nil when the source
	// does not say (a run record file from before it was recorded).
	Log *Log `json:"log,omitempty"`

	// Slurm is the batch job the run trained in, when it ran on a
	// Slurm node (the broker's record of the run).
	Slurm *metrics.Slurm `json:"slurm,omitempty"`
}

// Log is the integrity of a run's log as the broker held it.
type Log struct {
	// LastSeq is the highest seq the agent said it spooled;
	// HeldThrough the highest the broker stored with every lower one.
	LastSeq     uint64 `json:"last_seq"`
	HeldThrough uint64 `json:"held_through"`
	// DisputedRecords counts records the broker refused because a
	// different record was already stored at their seq (the lowest such
	// seq is FirstDisputedSeq).
	DisputedRecords  uint64 `json:"disputed_records"`
	FirstDisputedSeq uint64 `json:"first_disputed_seq,omitempty"`
	// Complete is held_through == last_seq with nothing disputed (DESIGN
	// §10), written out so a reader need not know the rule.
	Complete bool `json:"complete"`
}

// whole reports whether the log is whole and undisputed: held_through
// == last_seq and no record was disputed (DESIGN §10).
func (l *Log) whole() bool {
	return l.HeldThrough == l.LastSeq && l.DisputedRecords == 0
}

// Problem says what keeps the log from being complete ("" when it is).
func (l *Log) Problem() string {
	switch {
	case l.DisputedRecords > 0:
		return fmt.Sprintf("log disputed: %d record(s) were sent twice with different content (first at seq %d); the log is not proof of what the run printed",
			l.DisputedRecords, l.FirstDisputedSeq)
	case l.HeldThrough != l.LastSeq:
		return fmt.Sprintf("log incomplete: the broker holds seqs 1..%d without a gap, the agent spooled %d", l.HeldThrough, l.LastSeq)
	}
	return ""
}

// Evidence is the agent's conformance report with its signature.
type Evidence struct {
	// Report is the canonical report bytes exactly as the agent signed them.
	Report []byte `json:"report"`
	// Signature is base64 of the ASN.1 ECDSA signature over Report.
	Signature string `json:"signature"`
	// AgentPublicKeyPEM is the agent's PKIX PEM public key.
	AgentPublicKeyPEM string `json:"agent_public_key_pem"`
}

// Hardware is the inventory written to hardware-inventory.json.
type Hardware struct {
	GPUs []conformance.GPU `json:"gpus"`
	Node conformance.Node  `json:"node"`
	// NodeID is the broker's id of the node the run was placed on.
	NodeID string `json:"node_id,omitempty"`
}

// MetricPoint is one logged metric value.
type MetricPoint struct {
	Name  string    `json:"name"`
	Step  int64     `json:"step"`
	Value float64   `json:"value"`
	Time  time.Time `json:"time"`
}

// Finished states: the only ones that can be audited.
var finishedStates = map[string]bool{"succeeded": true, "failed": true, "cancelled": true, "finished": true}

// ErrInProgress is returned for a run that has not finished.
var ErrInProgress = errors.New("run is still in progress")

// Validate checks that r is complete enough to audit. Errors name the
// field and the fix.
func (r *Run) Validate() error {
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if r.AllocationID == "" {
		add("allocation_id is empty")
	}
	if !finishedStates[r.State] {
		return fmt.Errorf("allocation %s: %w (state %q): audit it after it finishes", r.AllocationID, ErrInProgress, r.State)
	}
	if r.StartedAt.IsZero() || r.FinishedAt.IsZero() {
		add("started_at and finished_at must be set")
	} else if r.FinishedAt.Before(r.StartedAt) {
		add("finished_at %s is before started_at %s", r.FinishedAt.UTC().Format(time.RFC3339), r.StartedAt.UTC().Format(time.RFC3339))
	}
	if strings.TrimSpace(r.SpecBytes) == "" {
		add("spec_bytes is empty: the declared spec is required")
	}
	if r.DeclaredFingerprint == "" {
		add("declared_fingerprint is empty")
	}
	if len(r.Conformance.Report) == 0 {
		add("conformance.report is empty: the agent's signed report is required")
	} else if _, err := conformance.Parse(r.Conformance.Report); err != nil {
		add("conformance.report: %v", err)
	}
	if r.Conformance.Signature == "" {
		add("conformance.signature is empty")
	}
	if _, err := conformance.ParsePublicKey([]byte(r.Conformance.AgentPublicKeyPEM)); err != nil {
		add("conformance.agent_public_key_pem: %v", err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("run record for allocation %q is incomplete: %s", r.AllocationID, strings.Join(errs, "; "))
	}
	return nil
}

// Source gives the audit the record of a finished run. The broker client
// implements it; FileSource reads a JSON run record.
type Source interface {
	Run(ctx context.Context, allocationID string) (*Run, error)
}

// FileSource reads a run record (a JSON-encoded Run) from a file. It is
// the input of offline re-audits (audit --run-file).
type FileSource struct{ Path string }

// Run reads the record and checks it is the one asked for.
func (s FileSource) Run(_ context.Context, allocationID string) (*Run, error) {
	b, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, fmt.Errorf("reading run record: %w", err)
	}
	var r Run
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("parsing run record %s: %w", s.Path, err)
	}
	if allocationID != "" && r.AllocationID != allocationID {
		return nil, fmt.Errorf("run record %s is for allocation %q, not %q", s.Path, r.AllocationID, allocationID)
	}
	return &r, nil
}
