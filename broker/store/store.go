// Package store defines what the broker persists and the Store contract
// its backends implement: broker/store/sqlite (embedded default, one file)
// and broker/store/postgres (shared by several broker replicas). Both are
// thin openers over package sqlstore and pass one shared contract suite
// (package storetest).
//
// Times are stored as Unix nanoseconds (UTC) so both backends compare them
// the same way.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
)

// ErrNotFound is returned when a looked-up record does not exist.
var ErrNotFound = errors.New("not found")

// Role is what a token may do.
type Role string

// Token roles. admin may do everything; submit may do what read may do
// (and place runs); agent tokens are only for gpupass-agent.
const (
	RoleAgent  Role = "agent"
	RoleSubmit Role = "submit"
	RoleRead   Role = "read"
	RoleAdmin  Role = "admin"
)

// Valid reports whether r is a known role.
func (r Role) Valid() bool {
	switch r {
	case RoleAgent, RoleSubmit, RoleRead, RoleAdmin:
		return true
	}
	return false
}

// Token is an API token as stored: only the SHA-256 of the secret is kept.
type Token struct {
	ID        string
	Hash      string // hex SHA-256 of the token secret
	Role      Role
	Regions   []string // glob patterns (us-*, eu-central-1); never empty
	CreatedAt time.Time
	Note      string
}

// Labels are what an agent declares about where it runs.
type Labels struct {
	Provider      string
	Region        string
	Zone          string
	PricePerHour  float64
	StorageClass  string
	BandwidthGbps float64
	Hostname      string
	// JobAddress and JobPortMin..JobPortMax are where the node's jobs
	// can be reached by the other nodes of a gang (agent --job-address,
	// --job-ports): the rendezvous of a run across several nodes is on
	// rank 0's. Empty (0) on a node that runs no gang rank: a Slurm or
	// Kubernetes node, or an agent of an earlier release. Columns of
	// agents since migration 15.
	JobAddress string
	JobPortMin int
	JobPortMax int
}

// Rendezvous reports whether the node advertises where the ranks of a
// gang can reach its jobs.
func (l *Labels) Rendezvous() bool {
	return l.JobAddress != "" && l.JobPortMin > 0 && l.JobPortMax >= l.JobPortMin
}

// Agent is an enrolled agent identity.
type Agent struct {
	ID             string
	PublicKeyPEM   []byte
	KeyFingerprint string // hex SHA-256 of the PKIX DER: one agent per key
	Labels         Labels
	AgentVersion   string
	TokenID        string // the token that enrolled it
	EnrolledAt     time.Time
}

// NodeIndex is what the registry indexes from a verified report.
type NodeIndex struct {
	Provider        string
	Region          string
	Zone            string
	Hostname        string
	Accelerator     string
	GPUName         string
	GPUCount        int
	GPUMemoryMiB    uint64
	StorageClass    string
	StorageFreeGB   float64
	StorageReadMBps float64
	BandwidthGbps   float64
	PricePerHour    float64
	// Runtime is the report's measured runtime, without its packages
	// (a run checks those on the node when it starts).
	Runtime            conformance.Runtime
	RuntimeFingerprint string
	Simulated          bool
	Profile            string
	Passed             bool
	// FailedChecks are the report's failed checks, "name: message"
	// (bounded by the broker): why the node is not certified, for nodes
	// and dry-run. Empty in indexes stored before it was kept.
	FailedChecks []string `json:",omitempty"`
	// GresGPUs is a Slurm node's GRES GPU count (its slurm.gres check):
	// what a job there gets, whatever the node has; nil for other nodes.
	GresGPUs    *int `json:",omitempty"`
	GeneratedAt time.Time
}

// Report is one verified conformance report, kept byte for byte with its
// signature (audits need exactly what was signed).
type Report struct {
	AgentID    string
	Bytes      []byte
	Signature  string
	ReceivedAt time.Time
	Index      NodeIndex
}

// Node is a registry entry: an enrolled agent, its last verified report
// (HasReport) and its liveness.
type Node struct {
	ID        string // = agent id
	Labels    Labels
	HasReport bool
	Index     NodeIndex // zero unless HasReport
	LastSeen  time.Time // zero when never seen
	RTTMS     float64   // -1 when not measured
	UpdatedAt time.Time
}

// Heartbeat is one liveness observation.
type Heartbeat struct {
	AgentID string
	At      time.Time
	RTTMS   float64 // -1 keeps the last measured value
}

// Launch is one attempt to start a run on a node; failed launches feed the
// 24-hour failure rate of the health score.
type Launch struct {
	NodeID  string
	At      time.Time
	Failed  bool
	Reason  string
	AllocID string
}

// LaunchStats counts launches of one node.
type LaunchStats struct {
	Launches int64
	Failures int64
}

// Store is the broker's persistence contract. Implementations are safe for
// concurrent use and may be shared by several brokers (postgres).
type Store interface {
	// CreateToken stores a token (its hash, never the secret).
	CreateToken(ctx context.Context, t Token) error
	// TokenByHash returns the token with that hash or ErrNotFound.
	TokenByHash(ctx context.Context, hash string) (Token, error)
	// ListTokens lists every token (hashes included; callers print ids).
	ListTokens(ctx context.Context) ([]Token, error)
	// DeleteToken removes a token by id or returns ErrNotFound.
	DeleteToken(ctx context.Context, id string) error

	// EnrollAgent stores an agent, keyed by its key fingerprint: enrolling
	// a known key keeps the stored id (a.ID is ignored then), updates
	// labels and version, and returns created=false. For a known key,
	// allow (when not nil) is called with the stored agent inside the
	// transaction, its row locked, before anything changes: an error from
	// it aborts the enrollment and is returned unchanged. So two
	// enrollments of one key never both pass allow against one stored row.
	EnrollAgent(ctx context.Context, a Agent, allow func(stored Agent) error) (stored Agent, created bool, err error)
	// Agent returns an agent by id or ErrNotFound.
	Agent(ctx context.Context, id string) (Agent, error)

	// SaveReport keeps a verified report and re-indexes its node.
	SaveReport(ctx context.Context, r Report) error
	// LatestReport returns the newest report of an agent or ErrNotFound.
	LatestReport(ctx context.Context, agentID string) (Report, error)

	// RecordHeartbeats stores a batch of heartbeats in one transaction;
	// a beat older than the stored one does not move last-seen back.
	RecordHeartbeats(ctx context.Context, beats []Heartbeat) error

	// Nodes lists every registry entry.
	Nodes(ctx context.Context) ([]Node, error)
	// NodesUpdatedSince lists entries enrolled or re-indexed at or after
	// t (UpdatedAt, the writer's clock): incremental registry refresh.
	NodesUpdatedSince(ctx context.Context, t time.Time) ([]Node, error)
	// Liveness returns last-seen and RTT of nodes seen at or after since.
	Liveness(ctx context.Context, since time.Time) ([]Heartbeat, error)

	// RecordLaunch stores a launch attempt.
	RecordLaunch(ctx context.Context, l Launch) error
	// LaunchStats counts launches per node at or after since: each run
	// once (COUNT DISTINCT of its allocation id), failed if any of its
	// launch records failed. A run recorded as launched and later as
	// failed for its node (lost under a Slurm job, refused after it was
	// running) is one failed launch, not one failed and one successful.
	// Records without an allocation id count one each.
	LaunchStats(ctx context.Context, since time.Time) (map[string]LaunchStats, error)

	// Close releases the store.
	Close() error
}
