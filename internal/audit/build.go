package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/spec"
)

// Names of the files in an audit report, in the order they are written.
const (
	FileEnvironment       = "environment-fingerprint.json"
	FileConformanceReport = "conformance-report.json"
	FileConformanceSig    = "conformance-report.sig"
	FileAgentKey          = "agent.pub"
	FileConformanceLog    = "conformance-log.txt"
	FileHardware          = "hardware-inventory.json"
	FileRunSummary        = "run-summary.json"
	FileManifest          = "manifest.json"
	// FileManifestBundle is the cosign bundle over manifest.json
	// (`cosign verify-blob --bundle manifest.sigstore.json manifest.json`).
	FileManifestBundle = "manifest.sigstore.json"
	// FileAttestation is the optional DSSE-signed in-toto statement.
	FileAttestation = "attestation.sigstore.json"
)

// ManifestVersion is the layout version of manifest.json.
const ManifestVersion = 1

// Manifest lists every file of the report except itself and the bundles
// that sign it.
type Manifest struct {
	ManifestVersion int    `json:"manifest_version"`
	GpupassVersion  string `json:"gpupass_version"`
	AllocationID    string `json:"allocation_id"`
	Simulated       bool   `json:"simulated"`
	// Group is set on the reports `gpupass audit GROUP` writes together.
	Group *ManifestGroup `json:"group,omitempty"`
	Files []ManifestFile `json:"files"`
}

// ManifestGroup names the run group a report was written with: every
// run of the group as the auditor's broker listed it, and whether it has
// a report (a run that ended before it started has none). Signed with
// each report, it lets the verifier of the set tell a report taken out
// of it from a group of fewer runs.
type ManifestGroup struct {
	ID   string             `json:"id"`
	Runs []ManifestGroupRun `json:"runs"`
}

// ManifestGroupRun is one run of a ManifestGroup.
type ManifestGroupRun struct {
	AllocationID string `json:"allocation_id"`
	Region       string `json:"region"`
	// Audited is false for a run that ended before it started.
	Audited bool `json:"audited"`
}

// ManifestFile is one file's entry in the manifest.
type ManifestFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Environment is environment-fingerprint.json.
type Environment struct {
	Declared DeclaredEnvironment `json:"declared"`
	Measured MeasuredEnvironment `json:"measured"`
	// Match is true when the measured runtime fingerprint equals the
	// declared one.
	Match bool `json:"match"`
	// Ranks are ranks 1.. of a run across several nodes, as their own
	// signed reports measured them; Uncertified joins why any of them
	// keeps the run from being certified. Absent for one-node runs.
	Ranks       []RankEnvironment `json:"ranks,omitempty"`
	Uncertified string            `json:"uncertified,omitempty"`
}

// Certified is Match for every rank: each rank's signed report measured
// the declared fingerprint (on rank 0's accelerator).
func (e *Environment) Certified() bool { return e.Match && e.Uncertified == "" }

// DeclaredEnvironment is the spec the run asked for.
type DeclaredEnvironment struct {
	File        string    `json:"file,omitempty"`
	Source      string    `json:"source"`
	Spec        spec.Spec `json:"spec"`
	Fingerprint string    `json:"fingerprint"`
}

// MeasuredEnvironment is what the agent measured.
type MeasuredEnvironment struct {
	AgentID     string              `json:"agent_id"`
	MeasuredAt  string              `json:"measured_at"`
	Runtime     conformance.Runtime `json:"runtime"`
	Fingerprint string              `json:"fingerprint"`
}

// RunSummary is run-summary.json.
type RunSummary struct {
	AllocationID string          `json:"allocation_id"`
	State        string          `json:"state"`
	Result       string          `json:"result"`
	StartedAt    string          `json:"started_at"`
	FinishedAt   string          `json:"finished_at"`
	DurationS    float64         `json:"duration_s"`
	Restarts     int             `json:"restarts"`
	BundleDigest string          `json:"bundle_digest,omitempty"`
	Simulated    bool            `json:"simulated"`
	Metrics      []MetricSummary `json:"metrics"`
	// Log is the log's integrity (verify fails a disputed or incomplete
	// one); absent in reports built before it was recorded.
	Log *Log `json:"log,omitempty"`
	// Slurm names the cluster, batch job, compute node and partition
	// the run trained in; absent for runs of other executors.
	Slurm *metrics.Slurm `json:"slurm,omitempty"`
}

// MetricSummary summarises one metric series.
type MetricSummary struct {
	Name      string  `json:"name"`
	Count     int     `json:"count"`
	NonFinite int     `json:"non_finite,omitempty"`
	FirstStep int64   `json:"first_step"`
	LastStep  int64   `json:"last_step"`
	First     float64 `json:"first"`
	Last      float64 `json:"last"`
	Min       float64 `json:"min"`
	Max       float64 `json:"max"`
	Mean      float64 `json:"mean"`
}

// BuildOptions control Build.
type BuildOptions struct {
	Signer  Signer
	Attest  bool   // add an in-toto statement signed as a DSSE envelope
	Version string // gpupass version written to the manifest
	// Group is the run group the report is written with (audit GROUP).
	Group *ManifestGroup
}

// Report is a built audit report.
type Report struct {
	Zip            []byte
	Manifest       Manifest
	ManifestSHA256 string
	Environment    Environment
}

type file struct {
	name string
	data []byte
}

// Build makes the audit report of a finished run. The zip is
// deterministic: the same run signed with the same key gives the same
// bytes (key signatures are RFC 6979 deterministic).
func Build(ctx context.Context, r *Run, opts BuildOptions) (*Report, error) {
	if opts.Signer == nil {
		return nil, fmt.Errorf("building audit report: no signer")
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	rep, err := conformance.Parse(r.Conformance.Report)
	if err != nil {
		return nil, fmt.Errorf("allocation %s: %w", r.AllocationID, err)
	}
	// A record whose agent signature does not verify is corrupt; signing
	// an audit over it would lend it credibility it does not have.
	if err := conformance.Verify([]byte(r.Conformance.AgentPublicKeyPEM), r.Conformance.Report, r.Conformance.Signature); err != nil {
		return nil, fmt.Errorf("allocation %s: the agent signature over the conformance report does not verify (%w): the run record is corrupt", r.AllocationID, err)
	}
	// Only the run's own report (measured at its runtime-init against its
	// spec, bound to the allocation) proves the run's environment; the
	// node's periodic report knows neither the spec nor the packages.
	switch {
	case rep.AllocationID == "":
		return nil, fmt.Errorf("allocation %s: the conformance report is the node's periodic report (it names no allocation), not the run's own signed report: it does not prove the run's environment", r.AllocationID)
	case rep.AllocationID != r.AllocationID:
		return nil, fmt.Errorf("allocation %s: the conformance report was measured for allocation %s, not this run", r.AllocationID, rep.AllocationID)
	}
	simulated := r.Simulated || rep.Simulated

	env := Environment{
		Declared: DeclaredEnvironment{
			File:        r.SpecFile,
			Source:      r.SpecBytes,
			Spec:        r.Spec,
			Fingerprint: r.DeclaredFingerprint,
		},
		Measured: MeasuredEnvironment{
			AgentID:     rep.AgentID,
			MeasuredAt:  rep.GeneratedAt,
			Runtime:     rep.Runtime,
			Fingerprint: rep.RuntimeFingerprint,
		},
		Match: rep.RuntimeFingerprint != "" && rep.RuntimeFingerprint == r.DeclaredFingerprint,
	}
	ranks, rankFiles, err := rankEnvironments(r, rep)
	if err != nil {
		return nil, err
	}
	env.Ranks, env.Uncertified = ranks, uncertified(ranks)
	for _, x := range r.Ranks {
		if xr, err := conformance.Parse(x.Report); err == nil && xr.Simulated {
			simulated = true
		}
	}
	hw := r.Hardware
	if hw == nil || len(hw.GPUs) == 0 {
		hw = &Hardware{GPUs: rep.GPUs, Node: rep.Node}
		if r.Hardware != nil {
			hw.NodeID = r.Hardware.NodeID
		}
	}
	metrics := r.MetricsSummary
	if metrics == nil {
		metrics = SummarizeMetrics(r.Metrics)
	}
	sum := RunSummary{
		AllocationID: r.AllocationID,
		State:        r.State,
		Result:       r.Result,
		StartedAt:    utc(r.StartedAt),
		FinishedAt:   utc(r.FinishedAt),
		DurationS:    r.FinishedAt.Sub(r.StartedAt).Seconds(),
		Restarts:     r.Restarts,
		BundleDigest: r.BundleDigest,
		Simulated:    simulated,
		Metrics:      metrics,
		Slurm:        r.Slurm,
	}
	if r.Log != nil {
		l := *r.Log
		l.Complete = l.whole()
		sum.Log = &l
	}

	var files []file
	add := func(name string, v any) error {
		b, err := marshalIndent(v)
		if err != nil {
			return fmt.Errorf("encoding %s: %w", name, err)
		}
		files = append(files, file{name, b})
		return nil
	}
	if err := add(FileEnvironment, env); err != nil {
		return nil, err
	}
	files = append(files,
		file{FileConformanceReport, r.Conformance.Report},
		file{FileConformanceSig, []byte(r.Conformance.Signature)},
		file{FileAgentKey, []byte(r.Conformance.AgentPublicKeyPEM)},
		file{FileConformanceLog, ConformanceLog(rep)},
	)
	if err := add(FileHardware, hw); err != nil {
		return nil, err
	}
	if err := add(FileRunSummary, sum); err != nil {
		return nil, err
	}
	files = append(files, rankFiles...)

	m := Manifest{
		ManifestVersion: ManifestVersion,
		GpupassVersion:  opts.Version,
		AllocationID:    r.AllocationID,
		Simulated:       simulated,
		Group:           opts.Group,
	}
	for _, f := range files {
		d := sha256.Sum256(f.data)
		m.Files = append(m.Files, ManifestFile{Name: f.name, Size: int64(len(f.data)), SHA256: hex.EncodeToString(d[:])})
	}
	mb, err := marshalIndent(m)
	if err != nil {
		return nil, fmt.Errorf("encoding manifest: %w", err)
	}
	md := sha256.Sum256(mb)
	files = append(files, file{FileManifest, mb})

	bundle, err := opts.Signer.SignBlob(ctx, mb)
	if err != nil {
		return nil, fmt.Errorf("signing manifest: %w", err)
	}
	files = append(files, file{FileManifestBundle, bundle})

	if opts.Attest {
		st, err := Statement(m, hex.EncodeToString(md[:]), env)
		if err != nil {
			return nil, err
		}
		att, err := opts.Signer.SignDSSE(ctx, InTotoPayloadType, st)
		if err != nil {
			return nil, fmt.Errorf("signing attestation: %w", err)
		}
		files = append(files, file{FileAttestation, att})
	}

	z, err := writeZip(files)
	if err != nil {
		return nil, err
	}
	return &Report{Zip: z, Manifest: m, ManifestSHA256: hex.EncodeToString(md[:]), Environment: env}, nil
}

func utc(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// marshalIndent encodes v as indented JSON with a final newline. The
// encoding is deterministic (struct order, sorted map keys).
func marshalIndent(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ConformanceLog renders the checks of a report for a person: one line a
// check with its status, duration, and expected/actual values.
func ConformanceLog(r *conformance.Report) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "gpupass conformance log\nagent: %s\nmeasured at: %s\n", r.AgentID, r.GeneratedAt)
	if r.Simulated {
		fmt.Fprintf(&b, "SIMULATED: measurements come from the simulated profile %q, not real hardware\n", r.Profile)
	}
	fmt.Fprintf(&b, "node: provider=%s region=%s zone=%s host=%s\n\n", r.Node.Provider, r.Node.Region, r.Node.Zone, r.Node.Hostname)
	width := len("check")
	for _, c := range r.Checks {
		width = max(width, len(c.Name))
	}
	fmt.Fprintf(&b, "%-6s %-*s %12s  %s\n", "STATUS", width, "CHECK", "DURATION", "DETAIL")
	failed := 0
	for _, c := range r.Checks {
		if c.Status == conformance.Fail {
			failed++
		}
		detail := "actual=" + c.Actual
		if c.Expected != "" {
			detail = "expected=" + c.Expected + " " + detail
		}
		if c.Cached {
			detail += " (cached)"
		}
		if c.Message != "" {
			detail += " — " + c.Message
		}
		fmt.Fprintf(&b, "%-6s %-*s %10.1fms  %s\n", strings.ToUpper(string(c.Status)), width, c.Name, c.DurationMS, detail)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	verdict := "PASSED"
	if failed > 0 {
		verdict = fmt.Sprintf("FAILED (%d failing checks)", failed)
	}
	fmt.Fprintf(&b, "\n%d checks, suite %.1fms: %s\n", len(r.Checks), r.SuiteDurationMS, verdict)
	return []byte(b.String())
}

// SummarizeMetrics summarises points per metric name, sorted by name.
// Non-finite values (NaN, ±Inf: a diverged loss) are counted, not
// averaged, because JSON cannot carry them.
func SummarizeMetrics(points []MetricPoint) []MetricSummary {
	type acc struct {
		s      MetricSummary
		sum    float64
		finite int
		seen   bool
	}
	by := map[string]*acc{}
	for _, p := range points {
		a := by[p.Name]
		if a == nil {
			a = &acc{s: MetricSummary{Name: p.Name}}
			by[p.Name] = a
		}
		a.s.Count++
		if math.IsNaN(p.Value) || math.IsInf(p.Value, 0) {
			a.s.NonFinite++
			continue
		}
		if !a.seen || p.Step < a.s.FirstStep {
			a.s.FirstStep, a.s.First = p.Step, p.Value
		}
		if !a.seen || p.Step >= a.s.LastStep {
			a.s.LastStep, a.s.Last = p.Step, p.Value
		}
		if !a.seen || p.Value < a.s.Min {
			a.s.Min = p.Value
		}
		if !a.seen || p.Value > a.s.Max {
			a.s.Max = p.Value
		}
		a.seen = true
		a.sum += p.Value
		a.finite++
	}
	out := make([]MetricSummary, 0, len(by))
	for _, a := range by {
		if a.finite > 0 {
			a.s.Mean = a.sum / float64(a.finite)
		}
		out = append(out, a.s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
