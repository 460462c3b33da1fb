// Package runview is the JSON shape of runs that `gpupass runs`, `train`
// and `cancel` print with --output json: a stable, documented contract for
// scripts and jq, independent of the wire format. The protobuf JSON it
// replaces spelled states as enum names ("ALLOC_STATE_FAILED"), 64-bit
// integers as strings and times as nanosecond epochs, and would change
// with every field added to the API.
//
// The rules (docs/using.md "Runs as JSON"): snake_case keys, every key always
// present; states in lower case; counts and prices as JSON numbers; times
// as RFC 3339 strings in UTC, null when the run has not reached that
// point; empty lists as [], never null. New keys may be added; existing
// ones keep their name, type and meaning.
//
// The package only converts and encodes: no network, no CLI.
package runview

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/health"
	"github.com/gpupass/gpupass/internal/metrics"
)

// Run is one run as --output json prints it.
type Run struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Region string `json:"region"`
	// Group names the runs one submission made, one per region
	// (`gpupass runs --group`); empty for runs from before groups.
	Group string `json:"group"`
	// State is pending, matched, starting, running, succeeded, failed or
	// cancelled (unspecified only from a broker that sent none).
	State  string `json:"state"`
	Reason string `json:"reason"`
	// NodeID is empty until the run is matched.
	NodeID          string        `json:"node_id"`
	Score           *health.Score `json:"score"` // the node's score when it was chosen; null before
	PricePerHour    float64       `json:"price_per_hour"`
	MaxPrice        float64       `json:"max_price"`        // 0: no cap
	SpecFingerprint string        `json:"spec_fingerprint"` // the hash gpupass validate prints
	Command         []string      `json:"command"`
	ExitCode        int32         `json:"exit_code"`
	Attempts        int32         `json:"attempts"`
	Restarts        int32         `json:"restarts"`
	CancelRequested bool          `json:"cancel_requested"`
	Simulated       bool          `json:"simulated"`
	ResumeElsewhere bool          `json:"resume_elsewhere"`
	ReplacedNodes   []string      `json:"replaced_nodes"` // nodes tried before the current one, in order
	// TimeLimitSeconds is the run's wall-clock limit (train
	// --time-limit, else the spec's resources.time-limit); 0: none.
	TimeLimitSeconds int64 `json:"time_limit_seconds"`
	// QueuePosition is the run's place in its region's queue while it
	// waits for a busy certified node (1: next); 0 when not waiting.
	QueuePosition int32 `json:"queue_position"`
	// QueuedAt is when it began waiting; null when it is not waiting.
	QueuedAt *Time `json:"queued_at"`
	// QueueBusyNodes is how many busy certified nodes could take it.
	QueueBusyNodes int32 `json:"queue_busy_nodes"`
	// QueueTimeoutSeconds bounds its wait in the queue (train
	// --queue-timeout, else the spec's resources.queue-timeout); 0: none.
	QueueTimeoutSeconds int64 `json:"queue_timeout_seconds"`
	CreatedAt           *Time `json:"created_at"`
	UpdatedAt           *Time `json:"updated_at"`
	StartedAt           *Time `json:"started_at"`
	FinishedAt          *Time `json:"finished_at"`
	Log                 Log   `json:"log"`
	// Slurm is where the run's batch job is on a Slurm cluster; null for
	// runs of other executors (and until the job is submitted).
	Slurm *Slurm `json:"slurm"`
}

// Slurm names a run's batch job: cluster, job id, compute node and
// partition (the same fields compare's report carries).
type Slurm = metrics.Slurm

// SlurmOf is the run's Slurm placement; nil when it has none.
func SlurmOf(r *gpupassv1.Run) *Slurm {
	p := r.GetSlurm()
	if p == nil {
		return nil
	}
	return &Slurm{Cluster: p.GetCluster(), JobID: p.GetJobId(), Node: p.GetNode(), Partition: p.GetPartition()}
}

// Log says how much of the run's log the broker holds, and whether it is
// proof of what the run printed (DESIGN §10).
type Log struct {
	// Complete: a terminal run whose records the broker holds gap-free up
	// to the last one the agent reported, none disputed.
	Complete bool `json:"complete"`
	// Disputed: some sequence number was sent twice with other content.
	Disputed         bool   `json:"disputed"`
	HeldThrough      uint64 `json:"held_through"`
	LastSeq          uint64 `json:"last_seq"`
	DisputedRecords  uint64 `json:"disputed_records"`
	FirstDisputedSeq uint64 `json:"first_disputed_seq"`
}

// Time is a point in time printed as RFC 3339 in UTC with the
// nanoseconds the broker keeps ("2026-12-02T03:51:59.123456789Z").
type Time struct{ time.Time }

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	return json.Marshal(t.UTC().Format(time.RFC3339Nano))
}

// List is the document of `runs` and `train`: {"runs": [...]}, newest
// first for `runs`, in region order for `train`.
type List struct {
	Runs []Run `json:"runs"`
}

// State is a run state in lower case: "failed" for ALLOC_STATE_FAILED.
func State(s gpupassv1.AllocState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ALLOC_STATE_"))
}

// FromProto converts a run from the broker's API.
func FromProto(r *gpupassv1.Run) Run {
	v := Run{
		ID: r.GetId(), Name: r.GetName(), Region: r.GetRegion(), Group: r.GetGroup(), State: State(r.GetState()), Reason: r.GetReason(),
		NodeID: r.GetNodeId(), PricePerHour: r.GetPricePerHour(), MaxPrice: r.GetMaxPrice(),
		SpecFingerprint: r.GetSpecFingerprint(), Command: nonNil(r.GetCommand()), ExitCode: r.GetExitCode(),
		Attempts: r.GetAttempts(), Restarts: r.GetRestarts(), CancelRequested: r.GetCancelRequested(),
		Simulated: r.GetSimulated(), ResumeElsewhere: r.GetResumeElsewhere(), ReplacedNodes: nonNil(r.GetReplacedNodes()),
		TimeLimitSeconds: r.GetTimeLimitSeconds(),
		QueuePosition:    r.GetQueuePosition(), QueuedAt: TimeOf(r.GetQueuedUnixNano()), QueueBusyNodes: r.GetQueueNodes(),
		QueueTimeoutSeconds: r.GetQueueTimeoutSeconds(),
		CreatedAt:           TimeOf(r.GetCreatedUnixNano()), UpdatedAt: TimeOf(r.GetUpdatedUnixNano()),
		StartedAt: TimeOf(r.GetStartedUnixNano()), FinishedAt: TimeOf(r.GetFinishedUnixNano()),
		Log: Log{Complete: r.GetLogComplete(), Disputed: r.GetLogDisputed(), HeldThrough: r.GetHeldThrough(),
			LastSeq: r.GetLastSeq(), DisputedRecords: r.GetDisputedRecords(), FirstDisputedSeq: r.GetFirstDisputedSeq()},
		Slurm: SlurmOf(r),
	}
	v.Score = health.FromProto(r.GetScore())
	return v
}

// WriteList prints runs as one List document.
func WriteList(w io.Writer, runs []*gpupassv1.Run) error {
	return Encode(w, "runs", ListOf(runs))
}

// ListOf is runs as one List document.
func ListOf(runs []*gpupassv1.Run) List {
	l := List{Runs: make([]Run, 0, len(runs))}
	for _, r := range runs {
		l.Runs = append(l.Runs, FromProto(r))
	}
	return l
}

// WriteRun prints one run as a Run document (`cancel`).
func WriteRun(w io.Writer, r *gpupassv1.Run) error {
	return Encode(w, "runs", FromProto(r))
}

// Encode prints v, a document of this package's rules (nodeview's too),
// as indented JSON; what names it in an error ("runs").
func Encode(w io.Writer, what string, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// Names, reasons and checks come from submitters, jobs and agents:
	// keep them as they are (json escapes control characters), without
	// HTML escaping.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encoding %s as JSON: %w", what, err)
	}
	return nil
}

// TimeOf is a nanosecond epoch from the broker's API as a Time; nil for
// 0, which the API sends for "not yet".
func TimeOf(ns int64) *Time {
	if ns == 0 {
		return nil
	}
	return &Time{time.Unix(0, ns)}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Terminal says whether a run has ended (succeeded, failed or cancelled):
// its figures are final.
func Terminal(s gpupassv1.AllocState) bool {
	return s == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || s == gpupassv1.AllocState_ALLOC_STATE_FAILED ||
		s == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
}

// DisputedNote says why a run's log is not proof: records sent twice with
// different content.
func DisputedNote(r *gpupassv1.Run) string {
	return fmt.Sprintf("log disputed: %d record(s) were sent twice with different content (first at seq %d); the broker kept the first of each, so this log is not proof of what the run printed",
		r.GetDisputedRecords(), r.GetFirstDisputedSeq())
}

// QueueNote says where a waiting run stands ("waiting in the queue of
// us-west-2 at position 2 for 3 busy certified nodes, up to 10m0s");
// empty for a run that is not waiting.
func QueueNote(r *gpupassv1.Run) string {
	if r.GetQueuePosition() == 0 {
		return ""
	}
	nodes := "nodes"
	if r.GetQueueNodes() == 1 {
		nodes = "node"
	}
	s := fmt.Sprintf("waiting in the queue of %s at position %d for %d busy certified %s", r.GetRegion(), r.GetQueuePosition(), r.GetQueueNodes(), nodes)
	if at := TimeOf(r.GetQueuedUnixNano()); at != nil {
		s += " since " + at.UTC().Format("15:04:05Z")
	}
	if t := r.GetQueueTimeoutSeconds(); t > 0 {
		s += fmt.Sprintf(", up to %s (--queue-timeout)", time.Duration(t)*time.Second)
	}
	return s
}
