package store

import (
	"context"
	"time"
)

// AdmissionState is an admin's decision on a node where the broker admits
// nodes by approval (gpupass-broker serve --admission).
type AdmissionState string

// Admission decisions. A node without one is admitted where its region's
// admission is open and pending where it is approve.
const (
	AdmissionApproved AdmissionState = "approved"
	AdmissionDenied   AdmissionState = "denied"
)

// Valid reports whether s is a known decision.
func (s AdmissionState) Valid() bool { return s == AdmissionApproved || s == AdmissionDenied }

// Admission is an admin's decision on one node: its key (the agent id is
// one per key) in the region it was enrolled in when decided. A node that
// moves to another region is undecided there.
type Admission struct {
	AgentID   string
	Region    string
	State     AdmissionState
	DecidedBy string // the admin token's id
	DecidedAt time.Time
}

// Admissions keeps admission decisions, shared by every broker replica on
// the store. The SQL backends implement it (a separate interface, like
// Leases: a store without it cannot admit nodes by approval).
type Admissions interface {
	// SetAdmission stores a decision, replacing the node's earlier one.
	SetAdmission(ctx context.Context, a Admission) error
	// Admissions lists decisions made at or after since (DecidedAt, the
	// writer's clock; the zero time: all), for the registry's refresh.
	Admissions(ctx context.Context, since time.Time) ([]Admission, error)
}
