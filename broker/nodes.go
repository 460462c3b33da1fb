package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/spec"
)

type nodeService struct{ b *Broker }

// checkFilter refuses region filters that reach outside the token scope,
// naming the first one: asking for a region you may not see is an error,
// not an empty answer.
func checkFilter(tok store.Token, regions []string) error {
	for _, r := range regions {
		r = strings.TrimSpace(r)
		if _, err := path.Match(r, ""); err != nil || r == "" {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("region filter %q is not a valid pattern", r))
		}
		// A pattern is in scope when a scope pattern matches it as a
		// literal ("eu-*" within "eu-*" or "*").
		if err := checkRegion(tok, r); err != nil {
			return err
		}
	}
	return nil
}

func (s *nodeService) ListNodes(ctx context.Context, req *connect.Request[gpupassv1.ListNodesRequest]) (*connect.Response[gpupassv1.ListNodesResponse], error) {
	b := s.b
	tok, _ := TokenFrom(ctx)
	if err := checkFilter(tok, req.Msg.Regions); err != nil {
		return nil, err
	}
	snap, err := b.snapshot(ctx)
	if err != nil {
		b.log.Error("reading registry", "err", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("registry unavailable"))
	}
	out := match.Run(match.Input{Nodes: snap.nodes, Launches: snap.launches, Beat: b.beat, Scope: tok.Regions,
		Regions: req.Msg.Regions, Now: time.Now(), OfflineAfter: b.cfg.OfflineAfter})
	resp := &gpupassv1.ListNodesResponse{}
	for _, r := range append(out.Candidates, out.Excluded...) {
		if r.OutOfScope {
			continue
		}
		filtered := false
		for _, x := range r.Reasons {
			filtered = filtered || x.Code == match.CodeRegionFilter || (x.Code == match.CodeOffline && !req.Msg.IncludeOffline)
		}
		if !filtered {
			resp.Nodes = append(resp.Nodes, toProto(r))
		}
	}
	return connect.NewResponse(resp), nil
}

// parseSpec reads the spec of a dry-run: YAML is validated by the same
// rules as `gpupass validate`; JSON must be a spec.Spec.
func parseSpec(m *gpupassv1.DryRunRequest) (*spec.Spec, string, error) {
	switch {
	case len(m.GetSpecYaml()) > 0:
		res := spec.Validate("spec_yaml", m.GetSpecYaml())
		if !res.Valid {
			var msgs []string
			for _, f := range res.Findings {
				if f.Severity == spec.SevError && len(msgs) < 5 {
					msgs = append(msgs, fmt.Sprintf("%d:%d %s: %s", f.Line, f.Column, f.Rule, f.Message))
				}
			}
			return nil, "", fmt.Errorf("spec_yaml is not a valid spec (%d errors): %s; run gpupass validate", res.Errors, strings.Join(msgs, "; "))
		}
		return res.Spec, res.Fingerprint, nil
	case len(m.GetSpecJson()) > 0:
		var sp spec.Spec
		dec := json.NewDecoder(bytes.NewReader(m.GetSpecJson()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&sp); err != nil {
			return nil, "", fmt.Errorf("spec_json: %v", err)
		}
		fp, err := spec.Fingerprint(&sp)
		if err != nil {
			return nil, "", fmt.Errorf("spec_json: %v", err)
		}
		return &sp, fp, nil
	}
	return nil, "", errors.New("no spec: set spec_yaml or spec_json")
}

func (s *nodeService) DryRun(ctx context.Context, req *connect.Request[gpupassv1.DryRunRequest]) (*connect.Response[gpupassv1.DryRunResponse], error) {
	b := s.b
	tok, _ := TokenFrom(ctx)
	m := req.Msg
	if err := checkFilter(tok, m.Regions); err != nil {
		return nil, err
	}
	sp, fp, err := parseSpec(m)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	minScore := match.DefaultMinScore
	if m.MinHealthScore != nil {
		minScore = m.GetMinHealthScore()
	}
	if minScore < -1e6 || minScore > 100 || m.MaxPrice < 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("min_health_score must be at most 100 and max_price not negative"))
	}
	snap, err := b.snapshot(ctx)
	if err != nil {
		b.log.Error("reading registry", "err", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("registry unavailable"))
	}
	out := match.Run(match.Input{Spec: sp, Nodes: snap.nodes, Launches: snap.launches, Beat: b.beat, Scope: tok.Regions,
		Regions: m.Regions, MinScore: minScore, MaxPrice: m.MaxPrice, Now: time.Now(), OfflineAfter: b.cfg.OfflineAfter})
	resp := &gpupassv1.DryRunResponse{SpecFingerprint: fp, MinHealthScore: minScore}
	for _, r := range out.Candidates {
		resp.Candidates = append(resp.Candidates, &gpupassv1.Candidate{Node: toProto(r)})
	}
	for _, r := range out.Excluded {
		// Excluded nodes travel lean (the reasons carry the measured
		// values that matter): a dry-run lists every one of them.
		x := &gpupassv1.Excluded{Node: leanProto(r)}
		if r.OutOfScope {
			// Out of scope: say where, not what.
			x.Node = &gpupassv1.Node{Id: r.Node.ID, Region: match.Region(&r.Node)}
		}
		for _, why := range r.Reasons {
			x.Reasons = append(x.Reasons, &gpupassv1.Reason{Code: why.Code, Field: why.Field, Expected: why.Expected, Measured: why.Measured, Message: why.Message})
		}
		resp.Excluded = append(resp.Excluded, x)
	}
	return connect.NewResponse(resp), nil
}

// leanProto is the short form of a node: identity, offer, liveness, score.
func leanProto(r *match.Result) *gpupassv1.Node {
	n := &r.Node
	p := &gpupassv1.Node{Id: n.ID, Provider: n.Labels.Provider, Region: match.Region(n), PricePerHour: match.Price(n),
		Online: r.Online, RttMs: n.RTTMS, ConformancePassed: n.Index.Passed, Health: healthProto(r.Score)}
	if n.HasReport {
		p.Provider, p.Accelerator, p.GpuCount, p.Simulated = n.Index.Provider, n.Index.Accelerator, int32(n.Index.GPUCount), n.Index.Simulated
	}
	if !n.LastSeen.IsZero() {
		p.LastSeenUnixNano = n.LastSeen.UnixNano()
	}
	return p
}

func healthProto(s match.Score) *gpupassv1.HealthScore {
	return &gpupassv1.HealthScore{
		Score: s.Score, LatencyMs: s.LatencyMS, LatencyUsedMs: s.LatencyUsedMS, LatencyCapMs: s.LatencyCapMS,
		LatencyPenalty: s.LatencyPenalty, FailureRatePct: s.FailureRatePct, Launches_24H: s.Launches24h,
		LaunchFailures_24H: s.LaunchFailures24h, FailurePenalty: s.FailurePenalty, ClassMeanPrice: s.ClassMeanPrice,
		PricePremiumPct: s.PricePremiumPct, PricePenalty: s.PricePenalty,
	}
}

func toProto(r *match.Result) *gpupassv1.Node {
	n := &r.Node
	ix := &n.Index
	p := &gpupassv1.Node{
		Id: n.ID, Provider: n.Labels.Provider, Region: match.Region(n), Zone: n.Labels.Zone, Hostname: n.Labels.Hostname,
		StorageClass: n.Labels.StorageClass, BandwidthGbps: n.Labels.BandwidthGbps, PricePerHour: match.Price(n),
		Online: r.Online, RttMs: n.RTTMS, ConformancePassed: ix.Passed, Health: healthProto(r.Score),
	}
	if !n.LastSeen.IsZero() {
		p.LastSeenUnixNano = n.LastSeen.UnixNano()
	}
	if n.HasReport {
		p.Provider, p.Zone, p.Hostname = ix.Provider, ix.Zone, ix.Hostname
		p.Accelerator, p.GpuName, p.GpuCount, p.GpuMemoryMib = ix.Accelerator, ix.GPUName, int32(ix.GPUCount), ix.GPUMemoryMiB
		p.StorageClass, p.StorageFreeGb, p.StorageReadMbps, p.BandwidthGbps = ix.StorageClass, ix.StorageFreeGB, ix.StorageReadMBps, ix.BandwidthGbps
		p.RuntimeFingerprint, p.Simulated, p.Profile = ix.RuntimeFingerprint, ix.Simulated, ix.Profile
		p.Runtime = &gpupassv1.Runtime{NvidiaDriver: ix.Runtime.NvidiaDriver, CudaDriverApi: ix.Runtime.CUDADriverAPI, Cuda: ix.Runtime.CUDA,
			Python: ix.Runtime.Python, Pytorch: ix.Runtime.PyTorch, TorchCuda: ix.Runtime.TorchCUDA, Cudnn: ix.Runtime.CuDNN, FipsEnabled: ix.Runtime.FIPSEnabled}
		if !ix.GeneratedAt.IsZero() {
			p.ReportGeneratedUnixNano = ix.GeneratedAt.UnixNano()
		}
	}
	return p
}
