// Package conformance defines the conformance report an agent measures and
// signs, and the signature scheme over it. It is the contract between
// agent, broker and audit: pure data and stdlib crypto only (no cgo, no
// network, no cosign), so every side can import it. Its Runtime is the
// one measured runtime: the report's, the broker's index and node
// listings' (proto.go converts to the API), and validate --local's.
//
// The signed bytes are the canonical JSON of a Report (package canonjson).
// The signature is base64 (standard encoding) of an ASN.1 DER ECDSA P-256
// signature over SHA-256 of those bytes; the public key is PKIX PEM. That is
// exactly what `cosign verify-blob --key agent.pub --signature report.sig
// --insecure-ignore-tlog report.json` checks.
package conformance

import (
	"encoding/json"
	"fmt"

	"github.com/gpupass/gpupass/internal/canonjson"
)

// SchemaVersion is the version of the Report layout.
const SchemaVersion = 1

// Status of one check.
type Status string

// Check statuses. Fail means the node does not conform; warn is reported
// but does not fail the suite; skip means the check could not apply (for
// example no spec value to compare against).
const (
	Pass Status = "pass"
	Fail Status = "fail"
	Warn Status = "warn"
	Skip Status = "skip"
)

// Check is one named conformance check (driver.version, cuda.toolkit,
// torch.abi, gpu.count, storage.read_mbps, …).
type Check struct {
	Name       string  `json:"name"`
	Expected   string  `json:"expected,omitempty"`
	Actual     string  `json:"actual"`
	Status     Status  `json:"status"`
	DurationMS float64 `json:"duration_ms"`
	Message    string  `json:"message,omitempty"`
	// Cached is true when the result was reused because nothing it
	// depends on can have changed since it was measured.
	Cached bool `json:"cached,omitempty"`
}

// Runtime is the software environment as measured on the node, in the
// vocabulary of the spec's runtime section. Empty means not found.
type Runtime struct {
	NvidiaDriver  string            `json:"nvidia-driver,omitempty"`
	CUDADriverAPI string            `json:"cuda-driver-api,omitempty"` // from cuDriverGetVersion, e.g. "12.2"
	CUDA          string            `json:"cuda,omitempty"`            // toolkit, from nvcc, e.g. "12.1.105"
	Python        string            `json:"python,omitempty"`
	PyTorch       string            `json:"pytorch,omitempty"` // torch.__version__, e.g. "2.1.0+cu121"
	TorchCUDA     string            `json:"torch-cuda,omitempty"`
	CuDNN         string            `json:"cudnn,omitempty"`
	Packages      map[string]string `json:"packages,omitempty"` // PEP 503 normalised name -> version
	FIPSEnabled   bool              `json:"fips-enabled"`
}

// GPU is one device as NVML (or a simulated profile) reports it.
type GPU struct {
	Index            int       `json:"index"`
	Name             string    `json:"name"`
	Class            string    `json:"class,omitempty"` // accelerator class, e.g. h100-sxm5
	UUID             string    `json:"uuid"`
	Serial           string    `json:"serial,omitempty"`
	VBIOS            string    `json:"vbios,omitempty"`
	MemoryTotalMiB   uint64    `json:"memory_total_mib"`
	MemoryFreeMiB    uint64    `json:"memory_free_mib"`
	PCIeGen          int       `json:"pcie_gen,omitempty"`
	PCIeWidth        int       `json:"pcie_width,omitempty"`
	NVLinkActive     int       `json:"nvlink_active_links"`
	ForeignProcesses []Process `json:"foreign_processes,omitempty"`
}

// Process is a process holding GPU memory.
type Process struct {
	PID           uint32 `json:"pid"`
	UsedMemoryMiB uint64 `json:"used_memory_mib"`
}

// Storage is the measured storage of the node's work path.
type Storage struct {
	Path         string   `json:"path"`
	FSType       string   `json:"fs_type,omitempty"`
	MountOptions []string `json:"mount_options,omitempty"`
	FreeGB       float64  `json:"free_gb"`
	ReadMBps     float64  `json:"read_mbps,omitempty"`
	Class        string   `json:"class,omitempty"` // declared class: standard | high-iops-nvme | ultra-nvme
}

// Node describes where the agent runs, as its labels declare.
type Node struct {
	Provider      string  `json:"provider,omitempty"`
	Region        string  `json:"region"`
	Zone          string  `json:"zone,omitempty"`
	PricePerHour  float64 `json:"price_per_hour,omitempty"`
	BandwidthGbps float64 `json:"bandwidth_gbps,omitempty"`
	Hostname      string  `json:"hostname,omitempty"`
}

// Report is what the agent measured, signed as a whole.
type Report struct {
	SchemaVersion int    `json:"schema_version"`
	AgentID       string `json:"agent_id"`
	GeneratedAt   string `json:"generated_at"` // RFC 3339, UTC, milliseconds
	// Simulated is true when any measurement came from a simulated
	// hardware profile instead of real hardware. It travels end to end.
	Simulated bool `json:"simulated"`
	// Profile names the simulated profile, when Simulated.
	Profile string `json:"profile,omitempty"`
	// AllocationID is set on a run's own report, measured at the run's
	// runtime-init against its spec: it binds the report to that run so it
	// cannot be passed off as the evidence of another. Empty on the node's
	// periodic reports.
	AllocationID string `json:"alloc_id,omitempty"`
	// SpecFingerprint is the fingerprint of the spec a run report was
	// measured against; RuntimeFingerprint equals it exactly when the node
	// ran what the spec declares.
	SpecFingerprint string  `json:"spec_fingerprint,omitempty"`
	Node            Node    `json:"node"`
	Runtime         Runtime `json:"runtime"`
	// RuntimeFingerprint is the fingerprint of the measured runtime, in
	// the same canonical form as a spec's fingerprint.
	RuntimeFingerprint string   `json:"runtime_fingerprint,omitempty"`
	GPUs               []GPU    `json:"gpus"`
	Storage            Storage  `json:"storage"`
	Checks             []Check  `json:"checks"`
	Notes              []string `json:"notes,omitempty"` // e.g. "NVML not available: …"
	SuiteDurationMS    float64  `json:"suite_duration_ms"`
	// Link is the link between a gang's nodes as this rank measured it
	// at gang start (issue #34); absent on a one-node run's report.
	Link *Link `json:"link,omitempty"`
}

// Link is an all-reduce of a fixed size across a gang's ranks, timed at
// gang start, with the bandwidth the spec declared beside it.
type Link struct {
	// Backend is torch.distributed's: gloo (TCP, no GPU) or nccl.
	Backend    string `json:"backend,omitempty"`
	Ranks      int    `json:"ranks"`
	Bytes      int64  `json:"bytes"`
	Iterations int    `json:"iterations"`
	// Seconds is the median all-reduce time of the slowest rank.
	Seconds float64 `json:"seconds,omitempty"`
	// AlgBWGbps is bytes / seconds; BusBWGbps, the figure compared with
	// the declared one, is nccl-tests' bus bandwidth (Formula), both in
	// Gbit/s.
	AlgBWGbps float64 `json:"algbw_gbps"`
	BusBWGbps float64 `json:"busbw_gbps"`
	Formula   string  `json:"formula"`
	// DeclaredGbps is the spec's resources.network.bandwidth_gbps (0:
	// none declared); Shortfall is BusBWGbps below it, or no
	// measurement where one was declared.
	DeclaredGbps float64 `json:"declared_gbps"`
	Shortfall    bool    `json:"shortfall"`
	// Required: the run was submitted with --require-bandwidth, so a
	// shortfall failed it.
	Required bool `json:"required,omitempty"`
	// MasterAddr is where rank 0 listened (127.0.0.1: simulated nodes
	// on one machine, measured over loopback).
	MasterAddr string `json:"master_addr"`
	// Simulated is false: the figure is measured, also between simulated
	// nodes (over whatever link joins them).
	Simulated bool `json:"simulated"`
	// Warm: the measurement's process was started before the gang (its
	// torch imported while the node waited) rather than at its start.
	// The same interpreter, script and measurement either way.
	Warm bool `json:"warm,omitempty"`
	// InCommand: measured by the rank's command's own Python, in a
	// process forked from it once its import of torch had finished
	// (a cluster rank running a Python script or module), rather than
	// by the node's isolated Python before the command; Torch is the
	// version of torch that measured, in either case.
	InCommand bool   `json:"in_command,omitempty"`
	Torch     string `json:"torch,omitempty"`
	// MeasuredBy is whose process measured the figure and wrote it where
	// the agent read it before signing: LinkByAgent (the agent's own,
	// a local gang) or LinkByJob (the rank's job, as the job's user: a
	// Slurm or Kubernetes rank's step or command, which could have
	// written any figure). Empty where nothing was attempted.
	MeasuredBy string `json:"measured_by,omitempty"`
	// Error says why nothing was measured.
	Error string `json:"error,omitempty"`
}

// Link.MeasuredBy values.
const (
	LinkByAgent = "agent"
	LinkByJob   = "job"
)

// Passed reports whether no check failed.
func (r *Report) Passed() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return false
		}
	}
	return true
}

// Marshal returns the canonical bytes of the report: what is signed.
func (r *Report) Marshal() ([]byte, error) {
	return canonjson.Marshal(r)
}

// Parse decodes report bytes strictly (unknown fields are errors, so a
// report from a newer agent is not half-read).
func Parse(b []byte) (*Report, error) {
	var r Report
	dec := json.NewDecoder(bytesReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("parsing conformance report: %w", err)
	}
	if r.SchemaVersion != SchemaVersion {
		return nil, fmt.Errorf("parsing conformance report: schema_version %d, want %d", r.SchemaVersion, SchemaVersion)
	}
	return &r, nil
}
