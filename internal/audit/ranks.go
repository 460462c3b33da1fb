package audit

import (
	"fmt"
	"strings"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/spec"
)

// A run across several nodes (resources.nodes above 1) is proven by
// every rank's signed run report, not rank 0's alone: the report holds
// each rank's report, signature and agent key as rank-N-… files (the
// manifest lists them, so the cosign signature covers them), and verify
// checks each one in a layer of its own. One-node reports are unchanged.

// RankEvidence is the signed run report of rank 1.. of a gang.
type RankEvidence struct {
	Rank int `json:"rank"`
	// AllocationID is the rank's allocation: RUN-rN (the broker's
	// naming, which the report must be bound to).
	AllocationID string `json:"allocation_id"`
	NodeID       string `json:"node_id,omitempty"`
	Evidence
}

// RankEnvironment is one rank's measured environment in
// environment-fingerprint.json.
type RankEnvironment struct {
	Rank         int    `json:"rank"`
	AllocationID string `json:"allocation_id"`
	AgentID      string `json:"agent_id,omitempty"`
	Fingerprint  string `json:"fingerprint,omitempty"`
	Accelerator  string `json:"accelerator,omitempty"`
	// Problem is why the rank keeps the run from being certified
	// (conformance.RankProblem), "" when it does not.
	Problem string `json:"problem,omitempty"`
}

// RankAllocationID is the allocation of rank of the run allocID.
func RankAllocationID(allocID string, rank int) string {
	return fmt.Sprintf("%s-r%d", allocID, rank)
}

// Rank file names: rank-N-conformance-report.json and so on.
func rankFile(rank int, name string) string { return fmt.Sprintf("rank-%d-%s", rank, name) }

// RankFiles are the names of rank's report, signature and agent key.
func RankFiles(rank int) (report, sig, key string) {
	return rankFile(rank, FileConformanceReport), rankFile(rank, FileConformanceSig), rankFile(rank, FileAgentKey)
}

// LayerRank is the verify layer of rank N of a gang: "rank-1".
func LayerRank(rank int) string { return fmt.Sprintf("rank-%d", rank) }

// rankEnvironments checks the run's rank evidence against the declared
// spec (nodes ranks, each bound to its allocation and signed by its
// key), returns what environment-fingerprint.json records of each and the
// files to add; an error for a record that is corrupt. A rank missing
// from the record is recorded as a problem, not refused: the report then
// proves the run uncertified, and verify fails it.
func rankEnvironments(r *Run, head *conformance.Report) ([]RankEnvironment, []file, error) {
	nodes := r.Spec.Resources.Nodes
	if nodes < 2 {
		if len(r.Ranks) > 0 {
			return nil, nil, fmt.Errorf("allocation %s: the record has %d rank report(s) but the declared spec runs on one node", r.AllocationID, len(r.Ranks))
		}
		return nil, nil, nil
	}
	by := map[int]*RankEvidence{}
	for i := range r.Ranks {
		x := &r.Ranks[i]
		if x.Rank < 1 || x.Rank >= nodes || by[x.Rank] != nil {
			return nil, nil, fmt.Errorf("allocation %s: rank report %d: want each of ranks 1 to %d once", r.AllocationID, x.Rank, nodes-1)
		}
		by[x.Rank] = x
	}
	var (
		envs  []RankEnvironment
		files []file
	)
	for rank := 1; rank < nodes; rank++ {
		e := RankEnvironment{Rank: rank, AllocationID: RankAllocationID(r.AllocationID, rank)}
		x := by[rank]
		if x == nil {
			e.Problem = fmt.Sprintf("rank %d (%s): sent no signed run report", rank, e.AllocationID)
			envs = append(envs, e)
			continue
		}
		rep, err := conformance.Parse(x.Report)
		if err != nil {
			return nil, nil, fmt.Errorf("allocation %s: rank %d's report: %w", r.AllocationID, rank, err)
		}
		if err := conformance.Verify([]byte(x.AgentPublicKeyPEM), x.Report, x.Signature); err != nil {
			return nil, nil, fmt.Errorf("allocation %s: the agent signature over rank %d's report does not verify (%w): the run record is corrupt", r.AllocationID, rank, err)
		}
		if rep.AllocationID != e.AllocationID {
			return nil, nil, fmt.Errorf("allocation %s: rank %d's report was measured for allocation %q, not %s", r.AllocationID, rank, rep.AllocationID, e.AllocationID)
		}
		e.AgentID, e.Fingerprint, e.Accelerator = rep.AgentID, rep.RuntimeFingerprint, conformance.Accelerator(rep)
		e.Problem = conformance.RankProblem(rank, head, rep, r.DeclaredFingerprint)
		envs = append(envs, e)
		rf, sf, kf := RankFiles(rank)
		files = append(files, file{rf, x.Report}, file{sf, []byte(x.Signature)}, file{kf, []byte(x.AgentPublicKeyPEM)})
	}
	return envs, files, nil
}

// uncertified joins the ranks' problems.
func uncertified(envs []RankEnvironment) string {
	var ps []string
	for _, e := range envs {
		if e.Problem != "" {
			ps = append(ps, e.Problem)
		}
	}
	return strings.Join(ps, "; ")
}

// gangNodes is how many nodes the report's declared spec runs on: the
// most of what its spec source, its parsed spec and its rank records
// say, so that no one of them can hide a rank.
func gangNodes(env Environment) int {
	n := max(env.Declared.Spec.Resources.Nodes, len(env.Ranks)+1)
	if doc, _ := spec.Parse(env.Declared.File, []byte(env.Declared.Source)); doc != nil {
		n = max(n, doc.Spec.Resources.Nodes)
	}
	// A spec allows 1024 nodes; a report claiming more is checked for
	// as many, and its fingerprint layer fails on the spec.
	return min(n, maxGangNodes)
}

// maxGangNodes is the most nodes a spec may run on (resources.nodes).
const maxGangNodes = 1024

// verifyRank checks rank's signed report in a report of a run across
// several nodes: present, signed by its agent (pinned as rank 0's is),
// bound to the rank's allocation, measured against the declared spec and
// matching its fingerprint on rank 0's accelerator.
func verifyRank(files map[string][]byte, m Manifest, env Environment, rank int, pinned []AgentKey, requirePinned bool) Layer {
	rf, sf, kf := RankFiles(rank)
	name := LayerRank(rank)
	b := &layerBuilder{l: Layer{Name: name}}
	for _, f := range []string{rf, sf, kf} {
		if _, ok := files[f]; !ok {
			b.fail(f, "present", "rank %d's signed run report is not in the audit report (%s missing): the run is not proven on every node", rank, f)
		}
	}
	if len(b.l.Problems) > 0 {
		return b.l
	}
	agent := verifyAgentFiles(name, files, rf, sf, kf, pinned, requirePinned)
	if len(agent.Problems) > 0 {
		for _, p := range agent.Problems {
			p.Message = fmt.Sprintf("rank %d: %s", rank, p.Message)
			b.l.Problems = append(b.l.Problems, p)
		}
		return b.l
	}
	r, err := conformance.Parse(files[rf])
	if err != nil {
		b.fail(rf, "parse", "rank %d: %v", rank, err)
		return b.l
	}
	head, err := conformance.Parse(files[FileConformanceReport])
	if err != nil {
		b.fail(FileConformanceReport, "parse", "%v", err)
		return b.l
	}
	if want := RankAllocationID(m.AllocationID, rank); r.AllocationID != want {
		b.fail(rf, "run-report", "rank %d's signed report was measured for allocation %q, rank %d of this run is %s", rank, r.AllocationID, rank, want)
	}
	if r.SpecFingerprint != env.Declared.Fingerprint {
		b.fail(rf, "spec-fingerprint", "rank %d's signed report was measured against spec %s, the declared spec is %s", rank, r.SpecFingerprint, env.Declared.Fingerprint)
	}
	if p := conformance.RankProblem(rank, head, r, env.Declared.Fingerprint); p != "" {
		b.fail(rf, "fingerprint-match", "%s: the run did not use the declared environment on every node", p)
	}
	if r.Simulated && !m.Simulated {
		b.fail(FileManifest, "simulated", "the manifest says simulated=false but rank %d's signed report is simulated", rank)
	}
	if len(b.l.Problems) == 0 {
		b.l.Detail = fmt.Sprintf("rank %d on %s: signed run report for %s, measured fingerprint %s on %s, as declared; %s",
			rank, r.AgentID, r.AllocationID, r.RuntimeFingerprint, conformance.Accelerator(r), agent.Detail)
		b.l.warning = agent.warning
		if b.l.warning != "" {
			b.l.warning = fmt.Sprintf("rank %d: %s", rank, b.l.warning)
		}
	}
	return b.l
}
