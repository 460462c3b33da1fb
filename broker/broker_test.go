package broker_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func specYAML(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fleet registers agents in four regions; returns them by name.
func fleet(t *testing.T, b *brokertest.Broker) map[string]*brokertest.Agent {
	t.Helper()
	tok := b.Token(t, store.RoleAgent, "*")
	cuda122 := brokertest.H100("us-east-1", 20)
	cuda122.CUDA = "12.2.140"
	a100 := brokertest.H100("eu-central-1", 18)
	a100.Class, a100.GPUName, a100.Count = "a100-80gb", "NVIDIA A100-SXM4-80GB", 4
	specs := map[string]brokertest.NodeSpec{
		"west":    brokertest.H100("us-west-2", 24),
		"west2":   brokertest.H100("us-west-2", 25),
		"east":    cuda122,
		"eu":      brokertest.H100("eu-central-1", 23),
		"eu-a100": a100,
		"ap":      brokertest.H100("ap-south-1", 60), // far above the class mean
	}
	out := map[string]*brokertest.Agent{}
	for name, s := range specs {
		out[name] = brokertest.Register(t, b.URL, tok, s)
	}
	return out
}

func reasonCodes(x *gpupassv1.Excluded) []string {
	var out []string
	for _, r := range x.Reasons {
		out = append(out, r.Code+":"+r.Field)
	}
	return out
}

func TestDryRun(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			agents := fleet(t, b)
			name := map[string]string{}
			for n, a := range agents {
				name[a.ID] = n
			}
			c := b.Clients(t, b.Token(t, store.RoleRead, "*"))
			ctx := context.Background()
			resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}}))
			if err != nil {
				t.Fatal(err)
			}
			if err := api.ExpandDryRun(resp.Msg); err != nil {
				t.Fatal(err)
			}
			m := resp.Msg
			if !strings.HasPrefix(m.SpecFingerprint, "sha256:") || m.MinHealthScore != 85 {
				t.Errorf("fingerprint %q, min score %v", m.SpecFingerprint, m.MinHealthScore)
			}
			var cands []string
			for _, cd := range m.Candidates {
				cands = append(cands, name[cd.Node.Id])
				h := cd.Node.Health
				want := math.Min(100, 100-h.LatencyPenalty-h.FailurePenalty-h.PricePenalty)
				if math.Abs(h.Score-want) > 1e-9 || h.LatencyPenalty != 0.1*h.LatencyUsedMs || h.LatencyCapMs != 50 {
					t.Errorf("%s: score terms inconsistent: %+v", name[cd.Node.Id], h)
				}
				if cd.Node.RttMs <= 0 || h.LatencyMs != cd.Node.RttMs {
					t.Errorf("%s: RTT not measured from heartbeats: rtt %v, latency term %v", name[cd.Node.Id], cd.Node.RttMs, h.LatencyMs)
				}
				if !cd.Node.Simulated || cd.Node.Accelerator != "h100-sxm5" || cd.Node.GpuCount != 8 || !cd.Node.Online {
					t.Errorf("%s: node not indexed from its report: %+v", name[cd.Node.Id], cd.Node)
				}
			}
			// h100 mean = (24+25+20+23+60)/5 = 30.4: all but ap are cheaper
			// than the mean and capped at 100, ordered then by price.
			if diff := cmp.Diff([]string{"eu", "west", "west2"}, cands); diff != "" {
				t.Errorf("candidates (-want +got):\n%s", diff)
			}
			got := map[string][]string{}
			for _, x := range m.Excluded {
				got[name[x.Node.Id]] = reasonCodes(x)
			}
			want := map[string][]string{
				"east":    {"runtime_mismatch:runtime.cuda"},
				"eu-a100": {"resource_mismatch:resources.accelerator", "resource_mismatch:resources.count"},
				"ap":      {"score_below_threshold:health_score"},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("excluded (-want +got):\n%s", diff)
			}
			for _, x := range m.Excluded {
				if name[x.Node.Id] == "east" {
					r := x.Reasons[0]
					if r.Expected != "12.1.105" || r.Measured != "12.2.140" {
						t.Errorf("cuda mismatch expected/measured = %s/%s", r.Expected, r.Measured)
					}
				}
				if name[x.Node.Id] == "ap" && x.Node.Health.PricePremiumPct < 90 {
					t.Errorf("ap premium %v%%, want about 97%%", x.Node.Health.PricePremiumPct)
				}
			}

			// Filters: region, max price, and a threshold callers lower.
			min := 0.0
			resp, err = c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)},
				Regions: []string{"us-*", "ap-*"}, MaxPrice: 24.5, MinHealthScore: &min}))
			if err != nil {
				t.Fatal(err)
			}
			if err := api.ExpandDryRun(resp.Msg); err != nil {
				t.Fatal(err)
			}
			cands = nil
			for _, cd := range resp.Msg.Candidates {
				cands = append(cands, name[cd.Node.Id])
			}
			if diff := cmp.Diff([]string{"west"}, cands); diff != "" {
				t.Errorf("filtered candidates (-want +got):\n%s", diff)
			}
			got = map[string][]string{}
			for _, x := range resp.Msg.Excluded {
				got[name[x.Node.Id]] = reasonCodes(x)
			}
			want = map[string][]string{
				"west2":   {"price_above_max:price_per_hour"},
				"east":    {"runtime_mismatch:runtime.cuda"},
				"eu":      {"region_filter:region"},
				"eu-a100": {"region_filter:region", "resource_mismatch:resources.accelerator", "resource_mismatch:resources.count"},
				"ap":      {"price_above_max:price_per_hour", "score_below_threshold:health_score"},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("filtered excluded (-want +got):\n%s", diff)
			}

			// Launch failures (runs fill them later) lower the score.
			for i := 0; i < 4; i++ {
				if err := b.Store.RecordLaunch(ctx, store.Launch{NodeID: agents["eu"].ID, At: time.Now(), Failed: i == 0}); err != nil {
					t.Fatal(err)
				}
			}
			resp, err = c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}, Regions: []string{"eu-central-1"}}))
			if err != nil {
				t.Fatal(err)
			}
			if err := api.ExpandDryRun(resp.Msg); err != nil {
				t.Fatal(err)
			}
			var h *gpupassv1.HealthScore
			for _, x := range resp.Msg.Excluded {
				if name[x.Node.Id] == "eu" {
					h = x.Node.Health
					if diff := cmp.Diff([]string{"score_below_threshold:health_score"}, reasonCodes(x)); diff != "" {
						t.Errorf("eu reasons (-want +got):\n%s", diff)
					}
				}
			}
			if h == nil {
				t.Fatalf("eu node with 25%% launch failures should be excluded: %v", resp.Msg)
			}
			if h.FailureRatePct != 25 || h.FailurePenalty != 125 || h.Launches_24H != 4 || h.LaunchFailures_24H != 1 {
				t.Errorf("failure terms %+v, want 25%% of 4 launches", h)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			fleet(t, b)
			ctx := context.Background()
			usRead := b.Token(t, store.RoleRead, "us-*")
			usAgent := b.Token(t, store.RoleAgent, "us-*")
			dry := func(regions ...string) *connect.Request[gpupassv1.DryRunRequest] {
				return connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}, Regions: regions})
			}
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			tests := []struct {
				name     string
				call     func() error
				code     connect.Code
				contains string
				secret   string
			}{
				{"missing token", func() error {
					_, err := b.Clients(t, "").Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
					return err
				},
					connect.CodeUnauthenticated, "missing token", ""},
				{"invalid token", func() error {
					_, err := b.Clients(t, "gpp_notarealtoken").Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
					return err
				}, connect.CodeUnauthenticated, "invalid token", "gpp_notarealtoken"},
				{"wrong role", func() error {
					_, err := brokertest.Enroll(ctx, b.URL, usRead, key, brokertest.H100("us-west-2", 1))
					return err
				}, connect.CodePermissionDenied, "needs role agent", usRead},
				{"agent out of region", func() error {
					_, err := brokertest.Enroll(ctx, b.URL, usAgent, key, brokertest.H100("eu-central-1", 1))
					return err
				}, connect.CodePermissionDenied, "region eu-central-1 is outside the scope", usAgent},
				{"agent token cannot list", func() error { _, err := b.Clients(t, usAgent).Node.DryRun(ctx, dry()); return err },
					connect.CodePermissionDenied, "needs role read", usAgent},
				{"filter out of scope", func() error { _, err := b.Clients(t, usRead).Node.DryRun(ctx, dry("eu-central-1")); return err },
					connect.CodePermissionDenied, "region eu-central-1 is outside the scope", usRead},
				{"pattern wider than scope", func() error {
					_, err := b.Clients(t, usRead).Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{Regions: []string{"*"}}))
					return err
				}, connect.CodePermissionDenied, "outside the scope", usRead},
			}
			for _, tt := range tests {
				err := tt.call()
				if brokertest.Code(err) != tt.code || err == nil || !strings.Contains(err.Error(), tt.contains) {
					t.Errorf("%s: err = %v, want %v containing %q", tt.name, err, tt.code, tt.contains)
				}
				if tt.secret != "" && err != nil && strings.Contains(err.Error(), tt.secret) {
					t.Errorf("%s: error leaks the token: %v", tt.name, err)
				}
			}

			// In scope: us nodes only; out-of-scope nodes are listed in a
			// dry-run as excluded with their region and nothing else.
			list, err := b.Clients(t, usRead).Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range list.Msg.Nodes {
				if !strings.HasPrefix(n.Region, "us-") {
					t.Errorf("us-* token sees node in %s", n.Region)
				}
			}
			if len(list.Msg.Nodes) != 3 {
				t.Errorf("us-* token sees %d nodes, want 3", len(list.Msg.Nodes))
			}
			resp, err := b.Clients(t, usRead).Node.DryRun(ctx, dry())
			if err != nil {
				t.Fatal(err)
			}
			if err := api.ExpandDryRun(resp.Msg); err != nil {
				t.Fatal(err)
			}
			scoped := 0
			for _, x := range resp.Msg.Excluded {
				if x.Reasons[0].Code == "region_scope" {
					scoped++
					if x.Node.Runtime != nil || x.Node.PricePerHour != 0 || x.Node.Region == "" {
						t.Errorf("out-of-scope node shows more than its region: %v", x.Node)
					}
				}
			}
			if scoped != 3 {
				t.Errorf("%d out-of-scope exclusions, want 3 (eu, eu, ap)", scoped)
			}
		})
	}
}

func TestRejectedReports(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			tok := b.Token(t, store.RoleAgent, "*")
			a := brokertest.NewAgent(t, b.URL, tok, brokertest.H100("us-west-2", 20))
			other := brokertest.NewAgent(t, b.URL, tok, brokertest.H100("us-west-2", 20))
			ctx := context.Background()
			// A beat echoing nothing is not counted (stale echo) and has no
			// RTT; the RTT is measured on the broker's clock from an
			// echoing beat; a report is wanted until one is accepted.
			hb, err := (&brokertest.Agent{ID: a.ID, Clients: a.Clients, Key: a.Key}).Beat(ctx)
			if err != nil || hb.RttMs != -1 || !hb.ReportWanted || !hb.StaleEcho {
				t.Errorf("beat without echo = %v, %v; want stale echo, rtt -1 and report wanted", hb, err)
			}
			if hb, err := a.Beat(ctx); err != nil || hb.RttMs < 0 {
				t.Errorf("echoing beat = %v, %v; want a measured RTT", hb, err)
			}
			good, sig, err := brokertest.Sign(a.Key, a.Report())
			if err != nil {
				t.Fatal(err)
			}
			tampered := bytes.Replace(good, []byte(`"cuda":"12.1.105"`), []byte(`"cuda":"12.4.131"`), 1)
			if bytes.Equal(tampered, good) {
				t.Fatal("test did not tamper with the report")
			}
			_, otherSig, _ := brokertest.Sign(other.Key, a.Report())
			wrongID := a.Report()
			wrongID.AgentID = other.ID
			wrongRegion := a.Report()
			wrongRegion.Node.Region = "eu-central-1"
			junk := []byte(`{"schema_version":1,"agent_id":"x","surprise":true}`)
			junkSig, _ := signRaw(a.Key, junk)
			tests := []struct {
				name     string
				upload   func() error
				code     connect.Code
				contains string
			}{
				{"tampered bytes", func() error { return a.UploadRaw(ctx, tampered, sig) }, connect.CodePermissionDenied, "signature does not verify"},
				{"other agent's key", func() error { return a.UploadRaw(ctx, good, otherSig) }, connect.CodePermissionDenied, "signature does not verify"},
				{"not base64", func() error { return a.UploadRaw(ctx, good, "!!!") }, connect.CodePermissionDenied, "signature does not verify"},
				{"names another agent", func() error { return a.Upload(ctx, wrongID) }, connect.CodePermissionDenied, "names agent"},
				{"names another region", func() error { return a.Upload(ctx, wrongRegion) }, connect.CodePermissionDenied, "names region"},
				{"malformed", func() error { return a.UploadRaw(ctx, junk, junkSig) }, connect.CodeInvalidArgument, "report rejected"},
				{"unknown agent", func() error {
					c := b.Clients(t, tok)
					_, err := c.Agent.UploadReport(ctx, connect.NewRequest(&gpupassv1.UploadReportRequest{AgentId: "agt-nope", Report: good, Signature: sig}))
					return err
				}, connect.CodeNotFound, "enroll first"},
			}
			for _, tt := range tests {
				err := tt.upload()
				if brokertest.Code(err) != tt.code || !strings.Contains(err.Error(), tt.contains) {
					t.Errorf("%s: err = %v, want %v containing %q", tt.name, err, tt.code, tt.contains)
				}
			}
			if _, err := b.Store.LatestReport(ctx, a.ID); err == nil {
				t.Error("a rejected report was stored")
			}
			if err := a.UploadRaw(ctx, good, sig); err != nil {
				t.Errorf("the untampered report is refused: %v", err)
			}
			if hb, err := a.Beat(ctx); err != nil || hb.ReportWanted {
				t.Errorf("beat after an accepted report = %v, %v; want no report wanted", hb, err)
			}
			r, err := b.Store.LatestReport(ctx, a.ID)
			if err != nil || !bytes.Equal(r.Bytes, good) || r.Signature != sig {
				t.Errorf("stored report differs from the signed bytes: %v", err)
			}
		})
	}
}

func TestOfflineDetection(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cfg := brokertest.Fast()
			// Long enough that a loaded machine does not miss the first
			// check (seen flaky at 500 ms), short enough to wait for.
			cfg.OfflineAfter = 2 * time.Second
			b := brokertest.Start(t, brokertest.NewDB(t, kind), cfg)
			tok := b.Token(t, store.RoleAgent, "*")
			a := brokertest.Register(t, b.URL, tok, brokertest.H100("us-west-2", 20))
			c := b.Clients(t, b.Token(t, store.RoleRead, "*"))
			ctx := context.Background()
			online := func() (bool, []string) {
				resp, err := c.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}}))
				if err != nil {
					t.Fatal(err)
				}
				if err := api.ExpandDryRun(resp.Msg); err != nil {
					t.Fatal(err)
				}
				if len(resp.Msg.Candidates) == 1 {
					return true, nil
				}
				return false, reasonCodes(resp.Msg.Excluded[0])
			}
			fresh := false
			var why []string
			for i := 0; i < 5 && !fresh; i++ {
				if _, err := a.Beat(ctx); err != nil {
					t.Fatal(err)
				}
				fresh, why = online()
			}
			if !fresh {
				t.Fatalf("freshly beating node excluded: %v", why)
			}
			// Stop beating; poll (no fixed sleep) until it is offline.
			deadline := time.Now().Add(10 * time.Second)
			for {
				ok, why := online()
				if !ok {
					if diff := cmp.Diff([]string{"offline:heartbeat"}, why); diff != "" {
						t.Errorf("reasons (-want +got):\n%s", diff)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("node never went offline after its heartbeats stopped")
				}
				time.Sleep(50 * time.Millisecond)
			}
			list, err := c.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
			if err != nil || len(list.Msg.Nodes) != 0 {
				t.Errorf("online-only listing shows an offline node: %v %v", list, err)
			}
			// A beat brings it back (retried: on a loaded machine the check
			// may come after OfflineAfter again).
			back := false
			for i := 0; i < 5 && !back; i++ {
				if _, err := a.Beat(ctx); err != nil {
					t.Fatal(err)
				}
				back, _ = online()
			}
			if !back {
				t.Error("node still excluded after new heartbeats")
			}
		})
	}
}

func TestRestartKeepsRegistry(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			db := brokertest.NewDB(t, kind)
			b1 := brokertest.Start(t, db, brokertest.Fast())
			tok := b1.Token(t, store.RoleAgent, "*")
			read := b1.Token(t, store.RoleRead, "*")
			a := brokertest.Register(t, b1.URL, tok, brokertest.H100("us-west-2", 20))
			b1.Stop(t)

			b2 := brokertest.Start(t, db, brokertest.Fast())
			list, err := b2.Clients(t, read).Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
			if err != nil {
				t.Fatalf("token from before the restart: %v", err)
			}
			if len(list.Msg.Nodes) != 1 || list.Msg.Nodes[0].Id != a.ID || list.Msg.Nodes[0].GpuCount != 8 {
				t.Fatalf("registry after restart = %v", list.Msg.Nodes)
			}
			// The agent re-enrolls with its key after the restart: same id.
			again, err := brokertest.Enroll(context.Background(), b2.URL, tok, a.Key, a.Node)
			if err != nil || again.ID != a.ID {
				t.Errorf("re-enroll after restart: id %v, err %v; want %s", again, err, a.ID)
			}
		})
	}
}

func TestTwoBrokersShareOnePostgres(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "postgres")
	b1 := brokertest.Start(t, db, brokertest.Fast())
	b2 := brokertest.Start(t, db, brokertest.Fast())
	tok := b1.Token(t, store.RoleAgent, "*")
	a := brokertest.Register(t, b1.URL, tok, brokertest.H100("eu-central-1", 20))
	// Heartbeats through the second replica count for the same node.
	a2, err := brokertest.Enroll(context.Background(), b2.URL, tok, a.Key, a.Node)
	if err != nil || a2.ID != a.ID {
		t.Fatalf("enrolling the same key on the second replica: %v, %v", a2, err)
	}
	read := b2.Token(t, store.RoleRead, "eu-*")
	// The registry entry is written synchronously; liveness reaches the
	// other replica within a heartbeat flush, so poll for it.
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := b2.Clients(t, read).Node.DryRun(context.Background(), connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}}))
		if err != nil {
			t.Fatal(err)
		}
		if err := api.ExpandDryRun(resp.Msg); err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.Candidates) == 1 && resp.Msg.Candidates[0].Node.Id == a.ID {
			if resp.Msg.Candidates[0].Node.RttMs <= 0 {
				t.Errorf("RTT measured by the first replica not seen by the second: %v", resp.Msg.Candidates[0].Node)
			}
			break
		}
		if len(resp.Msg.Excluded) != 1 || resp.Msg.Excluded[0].Node.Id != a.ID || time.Now().After(deadline) {
			t.Fatalf("second replica's dry-run = %v, want the node registered through the first", resp.Msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The same port answers gRPC, gRPC-Web and Connect/JSON (curl), and
// refuses oversized and malformed requests.
func TestProtocolsAndLimits(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	brokertest.Register(t, b.URL, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
	read := b.Token(t, store.RoleRead, "*")
	ctx := context.Background()
	for _, opt := range []struct {
		name string
		o    connect.ClientOption
	}{{"grpc", connect.WithGRPC()}, {"grpc-web", connect.WithGRPCWeb()}, {"connect-json", connect.WithProtoJSON()}} {
		hc := client.HTTPClient(false, nil)
		c := gpupassv1connectNodeClient(hc, b.URL, read, opt.o)
		resp, err := c.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
		if err != nil || len(resp.Msg.Nodes) != 1 {
			t.Errorf("%s: %v, %v", opt.name, resp, err)
		}
	}

	pc := testutil.HTTPClient(t)
	post := func(body []byte, token string) (int, string) {
		req, _ := http.NewRequest("POST", b.URL+"/gpupass.v1.NodeService/DryRun", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := pc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	body, _ := json.Marshal(map[string]any{"specYaml": specYAML(t)})
	if code, out := post(body, read); code != 200 || !strings.Contains(out, `"candidates"`) {
		t.Errorf("curl-style JSON dry-run: %d %s", code, out)
	}
	if code, out := post(body, ""); code != 401 || !strings.Contains(out, "missing token") {
		t.Errorf("JSON without token: %d %s, want 401", code, out)
	}
	if code, _ := post([]byte(`{"specYaml": 12`), read); code != 400 {
		t.Errorf("malformed JSON: %d, want 400", code)
	}
	big, _ := json.Marshal(map[string]any{"specYaml": bytes.Repeat([]byte("a"), api.MaxClientMessageBytes+1)})
	if code, out := post(big, read); code != 429 && code != 413 && code != 400 {
		t.Errorf("oversized request: %d %.200s, want refused", code, out)
	}
	if code, out := post([]byte(`{"specYaml":"bmFtZTogeAo="}`), read); code != 400 || !strings.Contains(out, "not a valid spec") {
		t.Errorf("invalid spec: %d %s, want 400 naming the problem", code, out)
	}
}

func signRaw(key *ecdsa.PrivateKey, b []byte) (string, error) {
	return conformanceSign(key, b)
}
