package store

import (
	"context"
	"time"
)

// RunEvidence is a run's own signed conformance report, measured by its
// agent at runtime-init against the run's spec, as the broker verified
// it: the report byte for byte, its signature and the agent key it was
// verified against (kept here because an agent may enroll a new key
// later, and the audit must name the one that signed).
type RunEvidence struct {
	AllocID           string
	AgentID           string
	Report            []byte
	Signature         string
	AgentPublicKeyPEM []byte
	ReceivedAt        time.Time
}

// Evidence persists run evidence. The SQL backends implement it next to
// Runs (a separate interface, so a store without audits still serves
// runs).
type Evidence interface {
	// PutRunEvidence keeps e for its allocation, replacing an earlier
	// one, after checking fence is the allocation's current fencing token
	// (ErrStaleFence otherwise; ErrNotFound for an unknown allocation).
	PutRunEvidence(ctx context.Context, e RunEvidence, fence uint64) error
	// RunEvidence returns an allocation's evidence or ErrNotFound.
	RunEvidence(ctx context.Context, allocID string) (RunEvidence, error)
}
