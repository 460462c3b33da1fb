//go:build e2e

package gpupass_test

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestGangEvidenceTwoLocalAgents (issue #34) is the evidence of a run
// across two nodes as a user and an auditor see it: `gpupass up` and two
// more agents in a region of their own whose operator claims a 100000
// Gbit/s link between them. At gang start the ranks measure the link (an
// all-reduce over gloo, here over 127.0.0.1) and each signs the figure
// in its run report with the spec's declared 100000 Gbit/s beside it: a
// recorded shortfall, and the run goes on; with --require-bandwidth the
// run fails naming both figures. `gpupass audit` of the run holds rank
// 1's signed report next to rank 0's, `audit verify` checks it in a
// rank-1 layer, and a zip with rank 1's report taken out fails naming it.
func TestGangEvidenceTwoLocalAgents(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	// Two nodes whose operator claims a 100000 Gbit/s link between them
	// (the label the broker matches on): only the measurement at gang
	// start can tell. They are two processes on this machine, so what
	// they measure is loopback.
	const region = "us-east-1"
	for i, ports := range []string{"29700-29799", "29800-29899"} {
		stack.StartAgent(t, "fast-link-"+string(rune('a'+i)), region, "--bandwidth-gbps", "100000",
			"--job-address", "127.0.0.1", "--job-ports", ports)
	}
	rc := stack.Runs(t)
	cfg := stack.Config(t)
	nc, err := client.Dial(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	upstack.WaitFor(t, ctx, "the two nodes of "+region+" to be certified", func() bool {
		resp, err := nc.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
		if err != nil {
			return false
		}
		n := 0
		for _, x := range resp.Msg.Nodes {
			if strings.HasPrefix(x.Hostname, "fast-link-") && x.Online && x.ConformancePassed {
				n++
			}
		}
		return n == 2
	})
	dir := t.TempDir()
	gp := func(args ...string) (stdout, all string, code int) {
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(cmd.Env, "COSIGN_PASSWORD=e2e-gang")
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("gpupass %v: %v", args, err)
		}
		return o.String(), o.String() + e.String(), code
	}
	runNamed := func(name string) *gpupassv1.Run {
		r := upstack.RunNamed(ctx, rc, name)
		if r == nil {
			t.Fatalf("no run named %s", name)
		}
		return r
	}
	// A spec declaring the link the nodes claim.
	absurd := filepath.Join(stack.Root, "examples", "ddp", "gpupass-absurd-link.yaml")
	b, err := os.ReadFile(filepath.Join(stack.Root, "examples", "ddp", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("bandwidth_gbps: 25,"), []byte("bandwidth_gbps: 100000,"), 1)
	// The test's own agents (StartAgent) measure no storage class.
	b = bytes.Replace(b, []byte("  storage: {type: standard, size_gb: 10}\n"), nil, 1)
	if err := os.WriteFile(absurd, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(absurd) })
	train := func(name string, extra ...string) (string, int) {
		args := append([]string{"train", "--spec", absurd, "--region", region, "--workdir", "examples/ddp", "--name", name, "--follow"}, extra...)
		_, all, code := gp(append(args, "--", py, "train_ddp.py", "--steps", "10", "--timeout", "60")...)
		return all, code
	}

	out, code := train("shortfall")
	if code != 0 {
		t.Fatalf("train of a gang declaring 100000 Gbit/s: exit %d, want the run to go on with a recorded shortfall\n%s", code, upstack.Tail(out, 4000))
	}
	run := runNamed("shortfall")
	// Each rank's log says the figure and the shortfall, as a WARN.
	for rank := range 2 {
		var line string
		for l := range strings.Lines(out) {
			if strings.HasPrefix(l, fmt.Sprintf("%s/%d | ", region, rank)) && strings.Contains(l, "link measured by this node's agent: ") {
				line = l
			}
		}
		if !strings.Contains(line, " WARN ") || !strings.Contains(line, "declared >= 100000 Gbit/s") || !strings.Contains(line, "below the declared 100000 Gbit/s: recorded as a shortfall") {
			t.Errorf("rank %d's log line of the link: %q; want a WARN with both figures, saying the shortfall was recorded\n%s", rank, line, upstack.Tail(out, 4000))
		}
	}
	if out, code := gpOK(t, gp, "audit", "keygen", "--out-prefix", filepath.Join(dir, "cosign")); code != 0 {
		t.Fatalf("keygen: exit %d\n%s", code, out)
	}
	zipPath := filepath.Join(dir, "audit.zip")
	stdout, all, code := gp("audit", run.Id, "--key", filepath.Join(dir, "cosign.key"), "--out", zipPath, "-o", "json")
	if code != 0 {
		t.Fatalf("audit: exit %d\n%s", code, all)
	}
	var res struct {
		Match       bool   `json:"fingerprint_match"`
		Uncertified string `json:"uncertified"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || !res.Match || res.Uncertified != "" {
		t.Errorf("audit -o json: %s (%v), want every rank matching", stdout, err)
	}
	files := testutil.ZipFiles(t, zipPath)
	for rank, name := range map[int]string{0: "conformance-report.json", 1: "rank-1-conformance-report.json"} {
		rep, ok := files[name]
		if !ok {
			t.Errorf("the audit zip has no %s: %v", name, slices.Sorted(maps.Keys(files)))
			continue
		}
		var r struct {
			AllocID string `json:"alloc_id"`
			Link    *struct {
				BusBWGbps    float64 `json:"busbw_gbps"`
				DeclaredGbps float64 `json:"declared_gbps"`
				Shortfall    bool    `json:"shortfall"`
				MasterAddr   string  `json:"master_addr"`
				Simulated    bool    `json:"simulated"`
				Formula      string  `json:"formula"`
				Error        string  `json:"error"`
				Warm         bool    `json:"warm"`
			} `json:"link"`
			Checks []struct {
				Name, Status, Message string
			} `json:"checks"`
		}
		if err := json.Unmarshal(rep, &r); err != nil {
			t.Fatal(err)
		}
		l := r.Link
		if l == nil {
			t.Errorf("rank %d's signed report (%s) records no link measurement", rank, r.AllocID)
			continue
		}
		t.Logf("rank %d (%s): measured %g Gbit/s bus bandwidth over %s, declared %g, shortfall %v (%s)", rank, r.AllocID, l.BusBWGbps, l.MasterAddr, l.DeclaredGbps, l.Shortfall, l.Formula)
		if l.Error != "" || !(l.BusBWGbps > 0) || l.DeclaredGbps != 100000 || !l.Shortfall || l.MasterAddr != "127.0.0.1" || l.Simulated {
			t.Errorf("rank %d's link: %+v; want measured over 127.0.0.1 (not simulated), 100000 declared, a shortfall", rank, *l)
		}
		if l.Warm {
			// An agent starts its warm measurement process after its
			// first gang, not before: this is each node's first.
			t.Errorf("rank %d's link, the node's first gang, was measured by a warm process: want none started before a node's first gang", rank)
		}
		warned := false
		for _, c := range r.Checks {
			warned = warned || (c.Name == "network.allreduce_gbps" && c.Status == "warn" && strings.Contains(c.Message, "below the declared 100000 Gbit/s"))
		}
		if !warned {
			t.Errorf("rank %d's report has no warning check network.allreduce_gbps for the shortfall: %+v", rank, r.Checks)
		}
	}
	ev, err := rc.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: run.Id}))
	if err != nil {
		t.Fatal(err)
	}
	if !ev.Msg.Certified || len(ev.Msg.GetRanks()) != 1 {
		t.Errorf("GetRunEvidence: certified %v (%s), %d rank report(s); want certified with rank 1's report", ev.Msg.Certified, ev.Msg.UncertifiedReason, len(ev.Msg.GetRanks()))
	}
	var keyArgs []string
	for i, pem := range [][]byte{ev.Msg.AgentPublicKeyPem, rankKey(ev.Msg)} {
		p := filepath.Join(dir, "agent"+string(rune('0'+i))+".pub")
		if err := os.WriteFile(p, pem, 0o644); err != nil {
			t.Fatal(err)
		}
		keyArgs = append(keyArgs, "--agent-key", p)
	}
	verify := func(zip string) (string, int) {
		_, all, code := gp(append([]string{"audit", "verify", zip, "--key", filepath.Join(dir, "cosign.pub")}, keyArgs...)...)
		return all, code
	}
	out, code = verify(zipPath)
	if code != 0 || !strings.Contains(out, "rank-1") {
		t.Errorf("audit verify of the gang's report: exit %d, want 0 with a rank-1 layer:\n%s", code, out)
	}
	t.Logf("audit verify:\n%s", out)
	cut := filepath.Join(dir, "cut.zip")
	writeZipWithout(t, zipPath, cut, "rank-1-conformance-report.json")
	if out, code := verify(cut); code == 0 || !strings.Contains(out, "rank-1-conformance-report.json") {
		t.Errorf("audit verify of the report without rank 1's: exit %d, want a failure naming rank-1-conformance-report.json:\n%s", code, out)
	}

	out, code = train("required", "--require-bandwidth")
	r := runNamed("required")
	r = upstack.GetRun(t, ctx, rc, r.Id)
	t.Logf("with --require-bandwidth: exit %d, %s: %s", code, r.State, r.Reason)
	if code == 0 || r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(r.Reason, "below the declared 100000 Gbit/s") ||
		!strings.Contains(r.Reason, "--require-bandwidth") || !strings.Contains(r.Reason, "measured ") {
		t.Errorf("train --require-bandwidth with 100000 Gbit/s declared: exit %d, run %s (%s); want failed naming the measured and the declared figure\n%s", code, r.State, r.Reason, upstack.Tail(out, 3000))
	}
	// Each node's second gang finds the process its first left started.
	for rank, rep := range upstack.RankLinks(t, ctx, rc, r.Id) {
		if rep.Link == nil || !rep.Link.Warm || !(rep.Link.BusBWGbps > 0) || rep.Link.MeasuredBy != "agent" {
			t.Errorf("rank %d's link in the node's second gang: %+v; want measured by the warm process the first gang left, measured_by agent", rank, rep.Link)
		}
	}
}

func gpOK(t *testing.T, gp func(...string) (string, string, int), args ...string) (string, int) {
	_, all, code := gp(args...)
	return all, code
}

// rankKey is rank 1's agent key as the broker serves it (rank 0's when
// the broker serves no rank: verify then fails on rank 1's key).
func rankKey(ev *gpupassv1.GetRunEvidenceResponse) []byte {
	for _, r := range ev.GetRanks() {
		if r.Rank == 1 {
			return r.AgentPublicKeyPem
		}
	}
	return ev.AgentPublicKeyPem
}

// writeZipWithout copies the zip at from to to without the entry drop.
func writeZipWithout(t *testing.T, from, to, drop string) {
	t.Helper()
	zr, err := zip.OpenReader(from)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range zr.File {
		if f.Name == drop {
			continue
		}
		if err := zw.Copy(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
