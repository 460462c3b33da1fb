package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/spec"
)

// demoRunRecord writes the audit's run record of a finished demo run:
// the run as the broker holds it, the spec, the metric series through the
// API, and the signed conformance report of the agent that ran it, read
// from that agent's state dir (a local stack has them all on this disk).
func demoRunRecord(ctx context.Context, rc gpupassv1connect.RunServiceClient, cfg *LocalConfig, allocID, specPath string, specYAML []byte, path string) (agentPub string, err error) {
	resp, err := rc.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: allocID}))
	if err != nil {
		return "", rpcError("reading run "+allocID, cfg.BrokerURL, err)
	}
	run := resp.Msg.Run
	doc, _ := spec.Parse(specPath, specYAML)
	if doc == nil {
		return "", fmt.Errorf("%s: not a valid spec", specPath)
	}
	fp, err := spec.Fingerprint(&doc.Spec)
	if err != nil {
		return "", err
	}
	agentDir, err := agentDirOf(cfg.StateDir, run.NodeId)
	if err != nil {
		return "", err
	}
	rep, err := os.ReadFile(filepath.Join(agentDir, "report.json"))
	if err != nil {
		return "", fmt.Errorf("the agent's signed report: %w", err)
	}
	sig, err := os.ReadFile(filepath.Join(agentDir, "report.sig"))
	if err != nil {
		return "", fmt.Errorf("the agent's report signature: %w", err)
	}
	agentPub = filepath.Join(agentDir, "agent.pub")
	pub, err := os.ReadFile(agentPub)
	if err != nil {
		return "", fmt.Errorf("the agent's public key: %w", err)
	}
	mr, err := rc.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: allocID}))
	if err != nil {
		return "", rpcError("reading metrics of "+allocID, cfg.BrokerURL, err)
	}
	var pts []audit.MetricPoint
	for _, p := range mr.Msg.Points {
		keys := make([]string, 0, len(p.Values))
		for k := range p.Values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			pts = append(pts, audit.MetricPoint{Name: k, Step: p.Step, Value: p.Values[k], Time: time.Unix(0, p.TimeUnixNano).UTC()})
		}
	}
	state := stateName(run.State)
	rec := audit.Run{
		AllocationID: run.Id, State: state, Result: state, Restarts: int(run.Restarts),
		StartedAt: time.Unix(0, run.StartedUnixNano).UTC(), FinishedAt: time.Unix(0, run.FinishedUnixNano).UTC(),
		SpecFile: specPath, SpecBytes: string(specYAML), Spec: doc.Spec, DeclaredFingerprint: fp,
		Conformance: audit.Evidence{Report: rep, Signature: strings.TrimSpace(string(sig)), AgentPublicKeyPEM: string(pub)},
		Metrics:     pts, Simulated: run.Simulated,
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return "", err
	}
	return agentPub, os.WriteFile(path, b, 0o644)
}

// agentDirOf finds the state dir of the local agent with the given id.
func agentDirOf(stateDir, nodeID string) (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, "agents", "*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "agent.json"))
		if err != nil {
			continue
		}
		var p struct {
			AgentID string `json:"agent_id"`
		}
		if json.Unmarshal(b, &p) == nil && p.AgentID == nodeID {
			return d, nil
		}
	}
	return "", fmt.Errorf("no local agent with id %s under %s", nodeID, filepath.Join(stateDir, "agents"))
}
