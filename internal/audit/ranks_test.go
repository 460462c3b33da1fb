package audit

import (
	"context"
	"crypto/ecdsa"
	"slices"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/conformance"
)

// gangRun is the fixture run as a run across two nodes, with rank 1's
// signed run report (by key, changed by mutate) beside rank 0's.
func gangRun(t *testing.T, f *fixture, key *ecdsa.PrivateKey, mutate func(*conformance.Report)) *Run {
	t.Helper()
	r := f.run(t)
	r.SpecBytes = strings.Replace(r.SpecBytes, "count: 2\n", "count: 2\n  nodes: 2\n", 1)
	r.Spec.Resources.Nodes = 2
	rank1 := f.run(t)
	f.resignReport(t, rank1, key, func(rep *conformance.Report) {
		rep.AllocationID, rep.AgentID = RankAllocationID(r.AllocationID, 1), "agt-rank1"
		if mutate != nil {
			mutate(rep)
		}
	})
	r.Ranks = []RankEvidence{{Rank: 1, AllocationID: RankAllocationID(r.AllocationID, 1), NodeID: "agt-rank1", Evidence: rank1.Conformance}}
	return r
}

// layerOf is res's layer named name.
func layerOf(res *Result, name string) *Layer {
	for i := range res.Layers {
		if res.Layers[i].Name == name {
			return &res.Layers[i]
		}
	}
	return nil
}

func problemsOf(l *Layer) string {
	if l == nil {
		return "(no such layer)"
	}
	var ps []string
	for _, p := range l.Problems {
		ps = append(ps, p.File+":"+p.Check+": "+p.Message)
	}
	return l.Status + " " + l.Detail + " " + strings.Join(ps, "; ")
}

// TestGangAudit (issue #34): the audit report of a run across several
// nodes holds every rank's signed run report, listed in the signed
// manifest, and verify checks each in a layer of its own (rank-1): a
// report with a rank's report removed, altered, forged by whoever holds
// the cosign key, or of another environment fails, naming the rank.
func TestGangAudit(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	rankKey := newKey(t)
	rankPub, err := conformance.PublicKeyPEM(rankKey)
	if err != nil {
		t.Fatal(err)
	}
	pinned := []AgentKey{{PEM: f.agentPub}, {PEM: rankPub}}
	good := f.build(t, gangRun(t, f, rankKey, nil), false)
	rf, sf, kf := RankFiles(1)
	listed := map[string]bool{}
	for _, m := range good.Manifest.Files {
		listed[m.Name] = true
	}
	for _, n := range []string{rf, sf, kf} {
		if !listed[n] {
			t.Errorf("the manifest does not list %s: %v", n, good.Manifest.Files)
		}
	}
	if !good.Environment.Certified() || len(good.Environment.Ranks) != 1 || good.Environment.Ranks[0].AgentID != "agt-rank1" {
		t.Errorf("environment: certified %v, ranks %+v", good.Environment.Certified(), good.Environment.Ranks)
	}
	res := Verify(context.Background(), good.Zip, VerifyOptions{Key: f.cosignPub, AgentKeys: pinned})
	if l := layerOf(res, LayerRank(1)); !res.OK || l == nil || l.Status != StatusOK {
		t.Fatalf("verify of a whole gang report: ok %v, failed %s; rank-1 layer %s", res.OK, res.FailedLayer, problemsOf(l))
	}
	t.Logf("rank-1: %s", layerOf(res, LayerRank(1)).Detail)

	base := entries(t, good.Zip)
	without := func(names ...string) []file {
		var out []file
		for _, x := range base {
			if !slices.Contains(names, x.name) {
				out = append(out, x)
			}
		}
		return out
	}
	// Another agent's key (whoever holds the cosign key) forging rank 1.
	forged := gangRun(t, f, newKey(t), nil)
	forgedFiles := entries(t, f.build(t, forged, false).Zip)
	// Rank 1's real agent, measuring another runtime.
	drift := f.build(t, gangRun(t, f, rankKey, func(r *conformance.Report) {
		r.Runtime.PyTorch, r.RuntimeFingerprint = "2.2.0", "sha256:"+strings.Repeat("1", 64)
	}), false)
	if drift.Environment.Certified() || !strings.Contains(drift.Environment.Uncertified, "rank 1 on agt-rank1: measured runtime fingerprint sha256:1111") {
		t.Errorf("a rank of another runtime: certified %v (%s), want uncertified naming rank 1", drift.Environment.Certified(), drift.Environment.Uncertified)
	}
	for _, tc := range []struct {
		name  string
		zip   []byte
		layer string
		want  string
	}{
		{"rank 1's report removed", rezip(t, without(rf)), LayerManifest, rf + ":present"},
		{"rank 1's report removed and the manifest re-signed", resign(t, without(rf, sf, kf), f.signer), LayerRank(1), "rank 1's signed run report is not in the audit report"},
		{"rank 1's report altered", rezip(t, replace(base, rf, flipByte(getFrom(t, base, rf)))), LayerManifest, rf + ":sha256"},
		{"rank 1's report altered and the manifest re-signed", resign(t, replace(base, rf, []byte(strings.Replace(string(getFrom(t, base, rf)), "agt-rank1", "agt-rankX", 1))), f.signer),
			LayerRank(1), "rank 1: the agent signature"},
		{"rank 1's report forged with another agent key", resign(t, forgedFiles, f.signer), LayerRank(1), "rank 1: the report was signed by an unknown agent key"},
		{"rank 1 measured another runtime", drift.Zip, LayerRank(1), "rank 1 on agt-rank1: measured runtime fingerprint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Verify(context.Background(), tc.zip, VerifyOptions{Key: f.cosignPub, AgentKeys: pinned})
			l := layerOf(res, tc.layer)
			if res.OK || res.FailedLayer != tc.layer || !strings.Contains(problemsOf(l), tc.want) {
				t.Errorf("ok %v, failed layer %q: %s; want %s failing with %q", res.OK, res.FailedLayer, problemsOf(l), tc.layer, tc.want)
			}
		})
	}
}
