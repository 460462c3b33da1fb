// Package nodeview is the JSON shape of nodes that `gpupass nodes` and
// `gpupass validate --dry-run` print with --output json: a documented
// contract for scripts and jq (docs/using.md "Nodes and dry runs as JSON"),
// independent of the wire format. The protobuf JSON it replaces spelled
// 64-bit integers as strings and times as nanosecond epochs, and printed
// zeros for every field a dry run's short form leaves out, which read as
// measurements ("storage_free_gb": 0).
//
// The rules are runview's: snake_case keys, every key always present
// (the one exception: a node outside the token's region scope is only
// {"id", "region", "out_of_scope": true}); counts, prices and scores as
// JSON numbers; times as RFC 3339 strings in UTC, null when unknown;
// empty lists as [], never null. New keys may be added; existing ones
// keep their name, type and meaning.
//
// The package only converts and encodes: no network, no CLI.
package nodeview

import (
	"encoding/json"
	"io"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/health"
	"github.com/gpupass/gpupass/internal/runview"
)

// Brief is a node as a dry run lists it: identity, offer, liveness and
// health score (the broker's short form; `gpupass nodes` has the rest).
type Brief struct {
	ID           string  `json:"id"`
	Provider     string  `json:"provider"`
	Region       string  `json:"region"`
	Accelerator  string  `json:"accelerator"` // class of its GPUs, e.g. h100-sxm5
	GPUCount     int32   `json:"gpu_count"`
	PricePerHour float64 `json:"price_per_hour"`
	Online       bool    `json:"online"`
	// LastSeenAt is the node's last heartbeat; null if it never sent one.
	LastSeenAt *runview.Time `json:"last_seen_at"`
	// RTTMS is the measured round trip to the broker; null until measured.
	RTTMS             *float64 `json:"rtt_ms"`
	Simulated         bool     `json:"simulated"`
	ConformancePassed bool     `json:"conformance_passed"`
	// Health is the score with each of its terms (runs' "score" shape).
	Health *health.Score `json:"health"`
	// OutOfScope: the node is in a region outside the token's scope; the
	// broker says where, not what, so only id and region are printed.
	OutOfScope bool `json:"out_of_scope"`
}

// MarshalJSON prints an out-of-scope node as id, region and
// out_of_scope alone: zeros in the other keys would read as facts.
func (b Brief) MarshalJSON() ([]byte, error) {
	type plain Brief // no MarshalJSON: no recursion
	if b.OutOfScope {
		return json.Marshal(struct {
			ID         string `json:"id"`
			Region     string `json:"region"`
			OutOfScope bool   `json:"out_of_scope"`
		}{b.ID, b.Region, true})
	}
	return json.Marshal(plain(b))
}

// Node is a node as `gpupass nodes` prints it: the short form and the
// rest of its last verified report.
type Node struct {
	ID              string  `json:"id"`
	Provider        string  `json:"provider"`
	Region          string  `json:"region"`
	Zone            string  `json:"zone"`
	Hostname        string  `json:"hostname"`
	Accelerator     string  `json:"accelerator"`
	GPUName         string  `json:"gpu_name"`
	GPUCount        int32   `json:"gpu_count"`
	GPUMemoryMiB    uint64  `json:"gpu_memory_mib"` // per GPU
	StorageClass    string  `json:"storage_class"`
	StorageFreeGB   float64 `json:"storage_free_gb"`
	StorageReadMBps float64 `json:"storage_read_mbps"`
	BandwidthGbps   float64 `json:"bandwidth_gbps"`
	PricePerHour    float64 `json:"price_per_hour"`
	// Runtime is what the node's last report measured; null without one.
	Runtime *Runtime `json:"runtime"`
	// RuntimeFingerprint is the hash of that runtime written as a spec
	// (no packages); a spec's own hash is its spec fingerprint.
	RuntimeFingerprint string        `json:"runtime_fingerprint"`
	Simulated          bool          `json:"simulated"`
	Profile            string        `json:"profile"` // the simulated hardware profile; "" on real hardware
	Online             bool          `json:"online"`
	LastSeenAt         *runview.Time `json:"last_seen_at"`
	RTTMS              *float64      `json:"rtt_ms"`
	ConformancePassed  bool          `json:"conformance_passed"`
	// FailedChecks are the last report's failed checks ("name: message").
	FailedChecks      []string      `json:"failed_checks"`
	ReportGeneratedAt *runview.Time `json:"report_generated_at"`
	Health            *health.Score `json:"health"`
	// Admission is admitted, pending (awaiting `gpupass nodes approve`)
	// or denied.
	Admission string `json:"admission"`
}

// Runtime is a node's measured software stack: conformance.Runtime
// spelt in this document's snake_case keys, every one always present. A
// conversion, which the compiler allows only while the two have the same
// fields, keeps it the same type (the broker sends no packages).
type Runtime struct {
	NvidiaDriver  string            `json:"nvidia_driver"`
	CUDADriverAPI string            `json:"cuda_driver_api"`
	CUDA          string            `json:"cuda"`
	Python        string            `json:"python"`
	PyTorch       string            `json:"pytorch"`
	TorchCUDA     string            `json:"torch_cuda"`
	CuDNN         string            `json:"cudnn"`
	Packages      map[string]string `json:"-"`
	FIPSEnabled   bool              `json:"fips_enabled"`
}

// List is the document of `gpupass nodes -o json`: {"nodes": [...]}, in
// the broker's order (by health score).
type List struct {
	Nodes []Node `json:"nodes"`
}

// DryRun is the broker's answer to `validate --dry-run`, under
// "dry_run" in validate's JSON document.
type DryRun struct {
	SpecFingerprint string  `json:"spec_fingerprint"`
	MinHealthScore  float64 `json:"min_health_score"`
	// CandidatesTotal and ExcludedTotal count every node; the lists hold
	// at most --limit of each (--all: every one).
	CandidatesTotal int           `json:"candidates_total"`
	ExcludedTotal   int           `json:"excluded_total"`
	Candidates      []Brief       `json:"candidates"` // best first
	Excluded        []Exclusion   `json:"excluded"`   // nearest misses first; [] with --excluded summary
	ReasonCounts    []ReasonCount `json:"reason_counts"`
	// Gangs and GangMisses answer a spec whose GPUs may need several
	// nodes (resources.nodes, or a count no one node holds): per region,
	// the best gang, or why there is none. Absent for one node.
	Gangs      []Gang     `json:"gangs,omitempty"`
	GangMisses []GangMiss `json:"gang_misses,omitempty"`
}

// Gang is nodes of one region that together hold a spec's GPUs, the
// same number on each (resources.count / the gang's size).
type Gang struct {
	Region      string   `json:"region"`
	Accelerator string   `json:"accelerator"`
	GPUsPerNode int      `json:"gpus_per_node"`
	NodeIDs     []string `json:"node_ids"` // best first
}

// GangMiss says why a region has no gang for the spec.
type GangMiss struct {
	Region string `json:"region"`
	Reason string `json:"reason"`
}

// Exclusion is an excluded node and every reason it was excluded.
type Exclusion struct {
	Node    Brief    `json:"node"`
	Reasons []Reason `json:"reasons"`
}

// Reason is why a node was excluded.
type Reason struct {
	// Code is runtime_mismatch, resource_mismatch, score_below_threshold,
	// region_filter, region_scope, price_above_max, offline, no_report
	// or conformance_failed.
	Code     string `json:"code"`
	Field    string `json:"field"` // e.g. runtime.cuda; "" when no one field
	Expected string `json:"expected"`
	Measured string `json:"measured"`
	Message  string `json:"message"` // one sentence with the values
}

// ReasonCount is how many excluded nodes have one reason, with the first
// few of them.
type ReasonCount struct {
	Code           string   `json:"code"`
	Field          string   `json:"field"`
	Nodes          int32    `json:"nodes"`
	ExampleNodeIDs []string `json:"example_node_ids"`
}

// codeRegionScope is the reason of a node outside the token's scope
// (broker/match.CodeRegionScope; this package imports no broker code).
const codeRegionScope = "region_scope"

// NodeOf converts a node in full form from the broker's API.
func NodeOf(n *gpupassv1.Node) Node {
	v := Node{
		ID: n.GetId(), Provider: n.GetProvider(), Region: n.GetRegion(), Zone: n.GetZone(), Hostname: n.GetHostname(),
		Accelerator: n.GetAccelerator(), GPUName: n.GetGpuName(), GPUCount: n.GetGpuCount(), GPUMemoryMiB: n.GetGpuMemoryMib(),
		StorageClass: n.GetStorageClass(), StorageFreeGB: n.GetStorageFreeGb(), StorageReadMBps: n.GetStorageReadMbps(),
		BandwidthGbps: n.GetBandwidthGbps(), PricePerHour: n.GetPricePerHour(), RuntimeFingerprint: n.GetRuntimeFingerprint(),
		Simulated: n.GetSimulated(), Profile: n.GetProfile(), Online: n.GetOnline(), LastSeenAt: runview.TimeOf(n.GetLastSeenUnixNano()),
		RTTMS: rtt(n.GetRttMs()), ConformancePassed: n.GetConformancePassed(), FailedChecks: nonNil(n.GetFailedChecks()),
		ReportGeneratedAt: runview.TimeOf(n.GetReportGeneratedUnixNano()), Health: health.FromProto(n.GetHealth()),
		Admission: n.GetAdmission(),
	}
	if r := conformance.RuntimeFromProto(n.GetRuntime()); r != nil {
		v.Runtime = (*Runtime)(r)
	}
	return v
}

// BriefOf converts a node in short (or full) form; outOfScope marks a
// node the broker told only the region of.
func BriefOf(n *gpupassv1.Node, outOfScope bool) Brief {
	return Brief{
		ID: n.GetId(), Provider: n.GetProvider(), Region: n.GetRegion(), Accelerator: n.GetAccelerator(), GPUCount: n.GetGpuCount(),
		PricePerHour: n.GetPricePerHour(), Online: n.GetOnline(), LastSeenAt: runview.TimeOf(n.GetLastSeenUnixNano()),
		RTTMS: rtt(n.GetRttMs()), Simulated: n.GetSimulated(), ConformancePassed: n.GetConformancePassed(),
		Health: health.FromProto(n.GetHealth()), OutOfScope: outOfScope,
	}
}

// DryRunOf converts a dry-run answer, in the inline layout (after
// api.ExpandDryRun).
func DryRunOf(m *gpupassv1.DryRunResponse) DryRun {
	d := DryRun{
		SpecFingerprint: m.GetSpecFingerprint(), MinHealthScore: m.GetMinHealthScore(),
		// A broker from before the totals lists every node.
		CandidatesTotal: max(int(m.GetCandidatesTotal()), len(m.GetCandidates())),
		ExcludedTotal:   max(int(m.GetExcludedTotal()), len(m.GetExcluded())),
		Candidates:      make([]Brief, 0, len(m.GetCandidates())),
		Excluded:        make([]Exclusion, 0, len(m.GetExcluded())),
		ReasonCounts:    make([]ReasonCount, 0, len(m.GetReasonCounts())),
	}
	for _, c := range m.GetCandidates() {
		d.Candidates = append(d.Candidates, BriefOf(c.GetNode(), false))
	}
	for _, x := range m.GetExcluded() {
		e := Exclusion{Reasons: make([]Reason, 0, len(x.GetReasons()))}
		out := false
		for _, r := range x.GetReasons() {
			out = out || r.GetCode() == codeRegionScope
			e.Reasons = append(e.Reasons, Reason{Code: r.GetCode(), Field: r.GetField(), Expected: r.GetExpected(),
				Measured: r.GetMeasured(), Message: r.GetMessage()})
		}
		e.Node = BriefOf(x.GetNode(), out)
		d.Excluded = append(d.Excluded, e)
	}
	for _, c := range m.GetReasonCounts() {
		d.ReasonCounts = append(d.ReasonCounts, ReasonCount{Code: c.GetCode(), Field: c.GetField(), Nodes: c.GetNodes(),
			ExampleNodeIDs: nonNil(c.GetExampleNodeIds())})
	}
	for _, g := range m.GetGangs() {
		d.Gangs = append(d.Gangs, Gang{Region: g.GetRegion(), Accelerator: g.GetAccelerator(), GPUsPerNode: int(g.GetGpusPerNode()),
			NodeIDs: nonNil(g.GetNodeIds())})
	}
	for _, g := range m.GetGangMisses() {
		d.GangMisses = append(d.GangMisses, GangMiss{Region: g.GetRegion(), Reason: g.GetReason()})
	}
	return d
}

// WriteList prints nodes as one List document.
func WriteList(w io.Writer, nodes []*gpupassv1.Node) error {
	return runview.Encode(w, "nodes", ListOf(nodes))
}

// ListOf is nodes as one List document.
func ListOf(nodes []*gpupassv1.Node) List {
	l := List{Nodes: make([]Node, 0, len(nodes))}
	for _, n := range nodes {
		l.Nodes = append(l.Nodes, NodeOf(n))
	}
	return l
}

// rtt is the API's round trip, -1 for "not measured yet", as null then.
func rtt(ms float64) *float64 {
	if ms < 0 {
		return nil
	}
	return &ms
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
