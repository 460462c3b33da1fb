package agent_test

// This test runs the agent against a real broker (ConnectRPC on a loopback
// port, SQLite store). It lives in the external test package: the agent
// itself never imports the broker (internal/depcheck), only its test does.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/spec"
)

type node struct {
	profile, region string
	price           float64
}

// startBroker serves a broker on a SQLite file (brokertest.Start, the
// one way tests start one) with the heartbeat these tests wait on.
func startBroker(t *testing.T) (url string, st store.Store) {
	t.Helper()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), broker.Config{Logger: slog.New(slog.DiscardHandler), HeartbeatInterval: time.Second})
	return b.URL, b.Store
}

func token(t *testing.T, st store.Store, role store.Role, regions ...string) string {
	t.Helper()
	secret, _, err := broker.CreateToken(context.Background(), st, role, regions, "test")
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

type running struct {
	stop func() error
	opts *agent.Options
}

func startAgent(t *testing.T, url, tok, stateDir string, n node) *running {
	t.Helper()
	o := &agent.Options{
		BrokerURL: url, Token: tok, StateDir: stateDir, QueryAddr: "127.0.0.1:0", AddrFile: filepath.Join(stateDir, "query.url"),
		Provider: "sim", Region: n.region, Zone: n.region + "a", PricePerHour: n.price, StorageClass: "standard",
		Python: "python3", Simulate: n.profile, SuiteInterval: time.Hour, ReadProbeMB: 1,
	}
	if err := o.Validate(true); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(20 * time.Second):
				runErr = errors.New("agent did not stop within 20 s")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return &running{stop: stop, opts: o}
}

func listNodes(t *testing.T, c *client.Clients, want int) []*gpupassv1.Node {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
		if err != nil {
			t.Fatalf("ListNodes: %s", api.Describe(err))
		}
		reported := 0
		for _, n := range resp.Msg.Nodes {
			if n.RuntimeFingerprint != "" && n.Online {
				reported++
			}
		}
		if reported >= want {
			return resp.Msg.Nodes
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d nodes reported: %v", reported, want, resp.Msg.Nodes)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestAgentsWithRealBroker(t *testing.T) {
	t.Parallel()
	url, st := startBroker(t)
	agentTok := token(t, st, store.RoleAgent, "*")
	readTok := token(t, st, store.RoleRead, "*")
	nodes := []node{{"h100-sxm5-8x", "us-west-2", 98}, {"a100-80gb-4x", "eu-central-1", 40}, {"rtx-4090-1x", "ap-northeast-1", 2}}
	var agents []*running
	for _, n := range nodes {
		agents = append(agents, startAgent(t, url, agentTok, t.TempDir(), n))
	}
	reader, err := client.Dial(url, client.Options{Token: readTok})
	if err != nil {
		t.Fatal(err)
	}
	listed := listNodes(t, reader, 3)
	byRegion := map[string]*gpupassv1.Node{}
	for _, n := range listed {
		byRegion[n.Region] = n
	}
	for _, n := range nodes {
		got := byRegion[n.region]
		if got == nil {
			t.Fatalf("no node in %s: %v", n.region, listed)
		}
		if !got.Simulated || got.Profile != n.profile || got.PricePerHour != n.price || !got.ConformancePassed {
			t.Errorf("%s: simulated=%v profile=%q price=%v passed=%v", n.region, got.Simulated, got.Profile, got.PricePerHour, got.ConformancePassed)
		}
	}
	// RTT is measured by the broker from the agent's echoed heartbeats.
	deadline := time.Now().Add(30 * time.Second)
	for {
		measured := 0
		for _, n := range listNodes(t, reader, 3) {
			if n.RttMs >= 0 {
				measured++
			}
		}
		if measured == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("RTT measured for %d of 3 nodes after 30 s", measured)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if c := byRegion["us-west-2"]; c.Accelerator != "h100-sxm5" || c.GpuCount != 8 || c.Runtime.GetPytorch() != "2.1.0+cu121" {
		t.Errorf("h100 node indexed as %s x%d torch %s", c.Accelerator, c.GpuCount, c.Runtime.GetPytorch())
	}

	// The broker matches the H100 node for the H100 spec and names why
	// the others are excluded.
	specYAML, err := os.ReadFile("testdata/h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dr, err := reader.Node.DryRun(context.Background(), connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML}, MinHealthScore: ptr(0.0),
		FullNodes: true})) // the candidates' runtime fingerprint is in the full form
	if err != nil {
		t.Fatalf("DryRun: %s", api.Describe(err))
	}
	if err := api.ExpandDryRun(dr.Msg); err != nil {
		t.Fatal(err)
	}
	if len(dr.Msg.Candidates) != 1 || dr.Msg.Candidates[0].Node.Region != "us-west-2" {
		t.Errorf("candidates %v, want the us-west-2 H100 node; %v", dr.Msg.Candidates, dr.Msg)
	}
	// The report's fingerprint covers no packages (the node cannot know
	// which a spec will pin): it equals the fingerprint of the same spec
	// without its packages, computed by the spec package itself.
	noPkgs := spec.Validate("h100-nopkgs.yaml", []byte(strings.Split(string(specYAML), "  packages:")[0]+
		"security:\n  fips-compliant: false\nresources:\n  accelerator: h100-sxm5\n  count: 8\n"))
	if !noPkgs.Valid {
		t.Fatalf("spec without packages: %+v", noPkgs.Findings)
	}
	if got := dr.Msg.Candidates[0].Node.RuntimeFingerprint; got != noPkgs.Fingerprint || got == dr.Msg.SpecFingerprint {
		t.Errorf("candidate fingerprint %s, want %s (the spec without packages), not %s", got, noPkgs.Fingerprint, dr.Msg.SpecFingerprint)
	}
	reasons := map[string][]string{}
	for _, e := range dr.Msg.Excluded {
		for _, r := range e.Reasons {
			reasons[e.Node.Region] = append(reasons[e.Node.Region], r.Code+":"+r.Field)
		}
	}
	if !strings.Contains(strings.Join(reasons["eu-central-1"], " "), "resource_mismatch:resources.accelerator") {
		t.Errorf("A100 exclusion reasons %v", reasons["eu-central-1"])
	}
	if !strings.Contains(strings.Join(reasons["ap-northeast-1"], " "), "runtime_mismatch:runtime.pytorch") {
		t.Errorf("RTX 4090 exclusion reasons %v", reasons["ap-northeast-1"])
	}

	// Restart keeps the identity: the same node id, no fourth node.
	first := byRegion["eu-central-1"].Id
	if err := agents[1].stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	startAgent(t, url, agentTok, agents[1].opts.StateDir, nodes[1])
	time.Sleep(1500 * time.Millisecond)
	after := listNodes(t, reader, 3)
	if len(after) != 3 {
		t.Errorf("%d nodes after a restart, want 3", len(after))
	}
	for _, n := range after {
		if n.Region == "eu-central-1" && n.Id != first {
			t.Errorf("restarted agent is %s, was %s", n.Id, first)
		}
	}
}

func TestAgentRefusedOutOfScope(t *testing.T) {
	t.Parallel()
	url, st := startBroker(t)
	euOnly := token(t, st, store.RoleAgent, "eu-*")
	o := &agent.Options{BrokerURL: url, Token: euOnly, StateDir: t.TempDir(), QueryAddr: "127.0.0.1:0", Region: "us-west-2",
		StorageClass: "standard", Simulate: "rtx-4090-1x", SuiteInterval: time.Hour, ReadProbeMB: 1}
	if err := o.Validate(true); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = a.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("enrolling out of scope: %v, want a 403 refusal", err)
	}
	bad := &agent.Options{BrokerURL: url, Token: "gpt_not_a_token", StateDir: t.TempDir(), QueryAddr: "127.0.0.1:0", Region: "eu-west-1",
		StorageClass: "standard", Simulate: "rtx-4090-1x", SuiteInterval: time.Hour, ReadProbeMB: 1}
	_ = bad.Validate(true)
	a2, err := agent.New(bad, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	err = a2.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "gpt_not_a_token") {
		t.Errorf("bad token: %v, want a 401 that does not echo the token", err)
	}
}

// TestTamperedReportRejected uploads the agent's own signed report with
// one byte changed: the broker must refuse it.
func TestTamperedReportRejected(t *testing.T) {
	t.Parallel()
	url, st := startBroker(t)
	tok := token(t, st, store.RoleAgent, "*")
	r := startAgent(t, url, tok, t.TempDir(), node{"h100-sxm5-8x", "us-east-1", 90})
	reader, _ := client.Dial(url, client.Options{Token: token(t, st, store.RoleRead, "*")})
	listed := listNodes(t, reader, 1)
	dir := r.opts.StateDir
	report, err := os.ReadFile(filepath.Join(dir, agent.ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := os.ReadFile(filepath.Join(dir, agent.SigFile))
	c, _ := client.Dial(url, client.Options{Token: tok})
	upload := func(b []byte) error {
		_, err := c.Agent.UploadReport(context.Background(), connect.NewRequest(&gpupassv1.UploadReportRequest{
			AgentId: listed[0].Id, Report: b, Signature: strings.TrimSpace(string(sig))}))
		return err
	}
	// The agent's own report, captured from its state dir and sent again,
	// is a replay: the broker already holds it.
	if err := upload(report); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "replayed") {
		t.Fatalf("replayed report: %v, want failed_precondition naming a replay", err)
	}
	// An on-demand run through the local endpoint signs and uploads a
	// fresh report: the broker's copy moves on.
	qurl, err := os.ReadFile(r.opts.AddrFile)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testutil.HTTPClient(t).Post(strings.TrimSpace(string(qurl))+"/v1/conformance/run", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var fresh struct {
		Report struct {
			AgentID     string `json:"agent_id"`
			GeneratedAt string `json:"generated_at"`
		} `json:"report"`
		Uploaded bool `json:"uploaded"`
	}
	err = json.NewDecoder(resp.Body).Decode(&fresh)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !fresh.Uploaded || fresh.Report.AgentID != listed[0].Id {
		t.Errorf("on-demand run: %d %+v %v", resp.StatusCode, fresh, err)
	}
	again := listNodes(t, reader, 1)
	if ts := time.Unix(0, again[0].ReportGeneratedUnixNano).UTC().Format("2006-01-02T15:04:05.000Z"); ts != fresh.Report.GeneratedAt {
		t.Errorf("broker holds the report of %s, the on-demand one is of %s", ts, fresh.Report.GeneratedAt)
	}

	tampered := bytes.Replace(report, []byte(`"simulated":true`), []byte(`"simulated":false`), 1)
	if bytes.Equal(tampered, report) {
		t.Fatal("report does not say simulated")
	}
	if err := upload(tampered); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("tampered report: %v, want permission_denied", err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestAgentOverTLS: a broker serving TLS with a self-signed certificate;
// the agent trusts it through --tls-ca and enrolls, and refuses it without.
func TestAgentOverTLS(t *testing.T) {
	t.Parallel()
	b, certFile := brokertest.StartTLS(t, brokertest.NewDB(t, "sqlite"), broker.Config{Logger: slog.New(slog.DiscardHandler), HeartbeatInterval: time.Second})
	url, st := b.URL, b.Store
	tok := token(t, st, store.RoleAgent, "*")

	o := &agent.Options{BrokerURL: url, Token: tok, TLSCA: certFile, StateDir: t.TempDir(), QueryAddr: "127.0.0.1:0",
		Region: "us-west-2", StorageClass: "standard", Simulate: "rtx-4090-1x", SuiteInterval: time.Hour, ReadProbeMB: 1}
	if err := o.Validate(true); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() { adone <- a.Run(actx) }()
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	reader, _ := client.Dial(url, client.Options{Token: token(t, st, store.RoleRead, "*"), TLSConfig: &tls.Config{RootCAs: pool}})
	listNodes(t, reader, 1)
	acancel()
	if err := <-adone; err != nil {
		t.Errorf("agent over TLS: %v", err)
	}

	// Without the CA the certificate is not trusted: the agent stops at
	// once (the deadline only guards against the old retry loop) and says
	// how to trust it.
	o2 := *o
	o2.TLSCA, o2.StateDir = "", t.TempDir()
	a2, err := agent.New(&o2, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(context.Background(), time.Minute)
	defer tcancel()
	err = a2.Run(tctx)
	if _, ok := api.UntrustedCert(err); !ok || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("untrusted broker certificate: %v, want an untrusted-certificate error at once", err)
	}
	for _, want := range []string{"enrolling with " + url, "not trusted", "x509: certificate signed by unknown authority", api.FieldCA + " is how to trust it", "system trust store"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("untrusted certificate error %q does not say %q", err, want)
		}
	}
}
