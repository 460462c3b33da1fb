package store

import (
	"context"
	"errors"
	"time"
)

// ErrStaleFence is returned when a call about an allocation carries a
// fencing token older than the allocation's: another placement owns it.
var ErrStaleFence = errors.New("stale fencing token")

// ErrNodeBusy is returned by UpdateAlloc when the update would put an
// allocation on a node that already holds another (HoldsNode): an agent
// runs one job at a time.
var ErrNodeBusy = errors.New("node already holds an active allocation")

// AllocState is a step of the allocation lifecycle:
// pending -> matched -> starting -> running -> succeeded | failed | cancelled.
type AllocState string

// Allocation states.
const (
	AllocPending   AllocState = "pending"
	AllocMatched   AllocState = "matched"
	AllocStarting  AllocState = "starting"
	AllocRunning   AllocState = "running"
	AllocSucceeded AllocState = "succeeded"
	AllocFailed    AllocState = "failed"
	AllocCancelled AllocState = "cancelled"
)

// Terminal reports whether no further edge leaves s.
func (s AllocState) Terminal() bool {
	return s == AllocSucceeded || s == AllocFailed || s == AllocCancelled
}

// HoldsNode reports whether an allocation in state s occupies its node.
func (s AllocState) HoldsNode() bool {
	return s == AllocMatched || s == AllocStarting || s == AllocRunning
}

// Alloc is one run placed (or to be placed) on one node.
type Alloc struct {
	ID     string
	Name   string
	Region string
	// Group names the runs one submission made (one per region): drawn
	// by the broker for the first, joined by the same token's others.
	// Empty for runs stored before groups existed.
	Group string
	// GroupSize is how many runs Group will hold: it has ended when that
	// many of its runs are terminal.
	GroupSize       int
	State           AllocState
	Reason          string // set on every terminal state
	NodeID          string // empty until matched
	ScoreJSON       []byte // the node's health score terms when chosen (broker-defined JSON)
	PricePerHour    float64
	Simulated       bool
	SpecJSON        []byte
	SpecYAML        []byte // the spec as submitted, when it was YAML (audits show it as written)
	SpecFingerprint string
	Command         []string
	Workdir         []byte // gzip tar, may be empty
	MaxPrice        float64
	MinScore        float64
	MaxRestarts     int
	GraceSeconds    int
	// TimeLimitSeconds is the run's wall-clock limit (train --time-limit,
	// else the spec's resources.time-limit); 0: none. In the JSON body:
	// no column, no migration.
	TimeLimitSeconds int64 `json:",omitempty"`
	ResumeElsewhere  bool
	// QueueTimeoutSeconds bounds how long the run may wait in its queue
	// (train --queue-timeout, else the spec's resources.queue-timeout);
	// 0: no bound. In the JSON body: no column.
	QueueTimeoutSeconds int64 `json:",omitempty"`
	// QueuedAt is when the run began waiting in its region's queue: the
	// broker found certified nodes that could take it, all busy. Zero
	// while it is not waiting (and once placed). Written to the
	// queued_at column too, which orders the queue (QueuedAllocs).
	QueuedAt time.Time `json:"-"`
	// QueueNodes are the busy nodes that could take the waiting run, as
	// the broker last matched it (at most MaxQueueNodes); QueueNodeCount
	// is how many there were. A run ahead in the queue sharing one of
	// them comes first. In the JSON body.
	QueueNodes     []string `json:",omitempty"`
	QueueNodeCount int      `json:",omitempty"`
	// Fence is the fencing token of the current placement: the broker
	// draws a fresh random one for every placement (never 0, never the
	// previous one), so a token cannot be guessed from another. Only
	// equality means anything; it is shown to the node it leases the
	// run to, never to read or submit clients.
	Fence           uint64
	CancelRequested bool
	ExitCode        int
	Attempts        int
	Restarts        int
	LastSeq         uint64   // highest seq the agent said it spooled
	HeldThrough     uint64   // records stored without a gap
	ResumeAfterSeq  uint64   // set when re-placed mid-run
	Replaced        []string // nodes tried before NodeID
	TokenID         string   // who submitted it
	CreatedAt       time.Time
	UpdatedAt       time.Time
	StartedAt       time.Time // zero until running
	FinishedAt      time.Time // zero until terminal

	// DisputedRecords counts records refused because a different record
	// was already stored at their seq (each distinct content once), and
	// FirstDisputedSeq is the lowest such seq (0: none). Written only by
	// AppendRecords. A run's log is complete only when HeldThrough ==
	// LastSeq and DisputedRecords == 0 (LogComplete).
	DisputedRecords  uint64
	FirstDisputedSeq uint64

	// Slurm is where the run's current batch job is, as the agent of a
	// Slurm node last reported it (nil for other executors). It lives in
	// the JSON body: no column, no migration.
	Slurm *SlurmPlacement `json:",omitempty"`

	// A run across several nodes (resources.nodes > 1) is a gang of
	// allocations, one per node: rank 0's is the run users see, ranks
	// 1..GangSize-1 carry Gang, rank 0's id, and are found by it
	// (GangAllocs; the gang_id column, migration 15). Each rank keeps
	// what a run has (fence, lease, log, report), so what protects a
	// run's proof protects each rank's. GangSize is the node count on
	// every rank (0 on a one-node run); Rank and GangSize are in the
	// JSON body only.
	Gang     string `json:",omitempty"`
	Rank     int    `json:",omitempty"`
	GangSize int    `json:",omitempty"`
	// MasterAddr and MasterPort are the gang's rendezvous for its
	// current lease, on every rank: rank 0's node's job address and a
	// port drawn from its job port range.
	MasterAddr string `json:",omitempty"`
	MasterPort int    `json:",omitempty"`
	// RequireBandwidth: a link measured below the spec's bandwidth at
	// gang start fails the run (--require-bandwidth). JSON body only.
	RequireBandwidth bool `json:",omitempty"`
	// RankDone is set on rank 0 when its own process succeeded while
	// other ranks still run: the run ends when they all have, and
	// succeeds only if every rank did. Its node stays held meanwhile.
	RankDone bool `json:",omitempty"`
	// EndedBy is why the broker stopped this rank: another rank of its
	// gang ended first ("rank 1 on agt-…: exited with code 3"). The
	// rank's cancelled becomes the run's failed, with this reason.
	EndedBy string `json:",omitempty"`
	// RankReason is rank 0's own reason when the run's Reason names
	// other ranks too (they failed with it).
	RankReason string `json:",omitempty"`
	// GangRestart is set on every rank while its gang stops for a fresh
	// attempt (a rank failed, hit a NaN or lost its node, and restarts
	// remain): why, naming the rank. A rank whose attempt ended waits
	// pending; once every rank has, the broker clears it and places the
	// gang again from rank 0's last shipped checkpoint.
	GangRestart string `json:",omitempty"`
}

// GangID is the gang a belongs to: rank 0's id, which is a's own on
// rank 0 (and on a one-node run, a gang of one).
func (a *Alloc) GangID() string {
	if a.Gang != "" {
		return a.Gang
	}
	return a.ID
}

// SlurmPlacement is a run's batch job on a Slurm cluster.
type SlurmPlacement struct {
	Cluster   string
	JobID     string
	Node      string
	Partition string
}

// LogComplete reports whether the broker holds a's whole log as the
// node sent it: every seq the agent spooled is stored without a gap and
// no seq was claimed by two different records (DESIGN §10).
func (a *Alloc) LogComplete() bool {
	return a.HeldThrough == a.LastSeq && a.DisputedRecords == 0
}

// AppendResult is what AppendRecords did with a batch.
type AppendResult struct {
	// HeldThrough is the highest seq held with every lower seq held.
	HeldThrough uint64
	// Disputed are the seqs of the batch that were refused because a
	// record with other content is stored at them (ascending). The
	// stored record stays; the allocation is marked disputed.
	Disputed []uint64
}

// RecordKind says what a stored run record holds.
type RecordKind int

// Record kinds (the wire's RecordKind values).
const (
	RecordEvent  RecordKind = 1
	RecordMetric RecordKind = 2
	// RecordCheckpoint is a chunk of a checkpoint file (internal/api).
	RecordCheckpoint RecordKind = 3
)

// RunRecord is one event or metric point of a run, by per-run seq.
type RunRecord struct {
	Seq  uint64
	Kind RecordKind
	Data []byte
}

// Runs is the persistence of allocations and their records. The SQL
// backends implement it next to Store.
type Runs interface {
	// CreateAlloc stores a new allocation.
	CreateAlloc(ctx context.Context, a Alloc) error
	// CreateAllocs stores allocations all at once or none (a gang's
	// ranks: no rank exists without the others).
	CreateAllocs(ctx context.Context, as []Alloc) error
	// Alloc returns an allocation (without Workdir, which can be large)
	// or ErrNotFound.
	Alloc(ctx context.Context, id string) (Alloc, error)
	// Workdir returns the allocation's work dir archive (nil for none).
	Workdir(ctx context.Context, id string) ([]byte, error)
	// UpdateAlloc reads the allocation (without Workdir, which it keeps), lets fn change it and writes it
	// back in one transaction (row-locked where the database can), so
	// two brokers never both move one allocation. An error from fn
	// aborts and is returned as is. UpdatedAt is set by the store.
	// When fn moves the allocation onto a node (HoldsNode) where another
	// allocation holds it, nothing is written and ErrNodeBusy returned:
	// the check and the write are atomic across brokers.
	UpdateAlloc(ctx context.Context, id string, fn func(a *Alloc) error) (Alloc, error)
	// UpdateAllocs is UpdateAlloc over several allocations in one
	// transaction (fn gets them in the order of ids): a gang is leased,
	// and ended, whole. When fn moves any of them onto a node held by
	// an allocation outside ids, or two of them onto one node, nothing
	// is written and ErrNodeBusy returned: no part of a gang ever holds
	// a node alone. ErrNotFound if any id is unknown.
	UpdateAllocs(ctx context.Context, ids []string, fn func(as []*Alloc) error) ([]Alloc, error)
	// GangAllocs returns the ranks 1.. of the gang whose rank 0 is
	// gang, in rank order (Workdir empty); none for a one-node run.
	GangAllocs(ctx context.Context, gang string) ([]Alloc, error)
	// ListAllocs and ActiveAllocs leave Workdir empty.
	// ListAllocs returns the newest allocations first, at most limit
	// (runs: a gang's ranks 1.. are left out),
	// of the regions inScope accepts (nil: every region). The store asks
	// inScope about each region it holds runs in, so the limit counts
	// only runs the caller may see.
	ListAllocs(ctx context.Context, limit int, inScope func(region string) bool) ([]Alloc, error)
	// ListAllocsAfter is ListAllocs continued past after, the last row
	// of a previous page: the allocations that come after it in the
	// newest-first order (created earlier, or at the same time with a
	// smaller id). A keyset, not an offset: rows created meanwhile shift
	// nothing, and a late page costs what the first does. A zero key
	// starts at the newest (after.ID empty).
	ListAllocsAfter(ctx context.Context, after AllocKey, limit int, inScope func(region string) bool) ([]Alloc, error)
	// GroupAllocs returns the allocations of group, oldest first, at
	// most limit (Workdir empty); none for an unknown group.
	GroupAllocs(ctx context.Context, group string, limit int) ([]Alloc, error)
	// SetGroupCI stores ci, the CI context (broker-defined JSON) the
	// submission that started group gave, with the token that gave it.
	// A group has one: a second call for it fails and stores nothing.
	SetGroupCI(ctx context.Context, group, tokenID string, ci []byte) error
	// GroupCI returns the CI context stored for group; nil when none.
	GroupCI(ctx context.Context, group string) ([]byte, error)
	// ActiveAllocs returns every allocation not in a terminal state.
	ActiveAllocs(ctx context.Context) ([]Alloc, error)
	// QueuedAllocs returns region's queue: its pending allocations with
	// a QueuedAt, in queue order (QueuedAt, then id), at most limit
	// (Workdir empty). Every replica reads the same queue from it.
	QueuedAllocs(ctx context.Context, region string, limit int) ([]Alloc, error)
	// AppendRecords stores records of an allocation after checking fence
	// is the allocation's current one (ErrStaleFence otherwise;
	// ErrNotFound for an unknown id). Each record is judged on its own:
	// a seq not stored yet is stored; a seq stored with the same kind
	// and data is an idempotent re-send (a lost reply); a seq stored
	// with other content is refused, listed in Disputed and counted on
	// the allocation (DisputedRecords, once per distinct content), and
	// the first record stays. The rest of the batch is stored either
	// way, so a sender is never wedged by retrying a batch that holds a
	// disputed seq. The call is atomic.
	AppendRecords(ctx context.Context, allocID string, fence uint64, recs []RunRecord) (AppendResult, error)
	// Records returns records with seq > afterSeq in seq order, at most
	// limit; kind 0 means every kind.
	Records(ctx context.Context, allocID string, afterSeq uint64, kind RecordKind, limit int) ([]RunRecord, error)
	// LogRecords is Records as a log shows them: the data of a
	// checkpoint record is cut to its header line (its first 4 KiB when
	// it has none), so reading a run's log does not load its checkpoint
	// files.
	LogRecords(ctx context.Context, allocID string, afterSeq uint64, kind RecordKind, limit int) ([]RunRecord, error)
}

// MaxQueueNodes bounds Alloc.QueueNodes: the order between two waiting
// runs needs only whether their nodes overlap, and a region's certified
// nodes of one class are a few dozen.
const MaxQueueNodes = 64

// AllocKey is an allocation's place in the newest-first listing order.
type AllocKey struct {
	CreatedAt time.Time
	ID        string
}
