package broker_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

func TestParseAdmission(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    []broker.AdmissionRule
		wantErr string
	}{
		{in: "open", want: []broker.AdmissionRule{{Pattern: "*", Mode: broker.AdmissionOpen}}},
		{in: " eu-*=approve , us-east-1=approve,open", want: []broker.AdmissionRule{
			{Pattern: "eu-*", Mode: broker.AdmissionApprove}, {Pattern: "us-east-1", Mode: broker.AdmissionApprove}, {Pattern: "*", Mode: broker.AdmissionOpen}}},
		{in: ""},
		{in: "eu-*=maybe", wantErr: `mode "maybe" is not open or approve`},
		{in: "eu-[=approve", wantErr: `region pattern "eu-["`},
		{in: "=approve", wantErr: `region pattern ""`},
		// No region is upper case (api.CheckRegion): the rule would
		// approve nothing.
		{in: "EU-*=approve", wantErr: `region pattern "EU-*": use a region (lowercase letters`},
	} {
		got, err := broker.ParseAdmission(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseAdmission(%q) = %v, want an error with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseAdmission(%q): %v", tc.in, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseAdmission(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

// TestParseRegions: a token's scope follows the region rule outside its
// glob syntax; one that no region can match is refused, not stored.
func TestParseRegions(t *testing.T) {
	t.Parallel()
	got, err := broker.ParseRegions(" us-*, eu-central-1 ,*")
	if diff := cmp.Diff([]string{"us-*", "eu-central-1", "*"}, got); err != nil || diff != "" {
		t.Errorf("ParseRegions: %v (-want +got):\n%s", err, diff)
	}
	for _, in := range []string{"US-*", "us-west-2,us_east", "eu-[", "us west"} {
		if _, err := broker.ParseRegions(in); err == nil || !strings.Contains(err.Error(), "lowercase letters, digits and '-'") {
			t.Errorf("ParseRegions(%q) = %v, want an error naming the region rule", in, err)
		}
	}
}

// TestAdmissionSharedByReplicas: two replicas on one PostgreSQL admit eu-*
// nodes by approval. A pending node is excluded from dry-runs with the
// reason and the command that admits it; an admin decision made through
// one replica holds on the other; admins outside the node's region and
// read tokens cannot decide; a node in an open region needs nothing; an
// approved node that moves to another region is pending there.
func TestAdmissionSharedByReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := brokertest.NewDB(t, "postgres")
	cfg := brokertest.Fast()
	cfg.Admission = []broker.AdmissionRule{{Pattern: "eu-*", Mode: broker.AdmissionApprove}}
	a, b := brokertest.Start(t, db, cfg), brokertest.Start(t, db, cfg)
	agentTok := a.Token(t, store.RoleAgent, "*")
	eu := brokertest.Register(t, a.URL, agentTok, brokertest.H100("eu-central-1", 20))
	us := brokertest.Register(t, a.URL, agentTok, brokertest.H100("us-west-2", 20))
	adminEU, adminUS := a.Clients(t, a.Token(t, store.RoleAdmin, "eu-*")), a.Clients(t, a.Token(t, store.RoleAdmin, "us-*"))
	readA, readB := a.Clients(t, a.Token(t, store.RoleRead, "*")), b.Clients(t, a.Token(t, store.RoleRead, "*"))

	admission := func(c interface {
		ListNodes(context.Context, *connect.Request[gpupassv1.ListNodesRequest]) (*connect.Response[gpupassv1.ListNodesResponse], error)
	}) map[string]string {
		t.Helper()
		resp, err := c.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, n := range resp.Msg.Nodes {
			out[n.Id] = n.Admission
		}
		return out
	}
	// eventually waits until replica c shows want (replicas read each
	// other's writes within the snapshot TTL).
	eventually := func(what string, c interface {
		ListNodes(context.Context, *connect.Request[gpupassv1.ListNodesRequest]) (*connect.Response[gpupassv1.ListNodesResponse], error)
	}, want map[string]string) {
		t.Helper()
		var got map[string]string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got = admission(c); cmp.Equal(want, got) {
				return
			}
		}
		t.Fatalf("%s (-want +got):\n%s", what, cmp.Diff(want, got))
	}
	eventually("before any decision", readB.Node, map[string]string{eu.ID: "pending", us.ID: "admitted"})

	// The dashboard's nodes page says so too, with the command.
	br := newBrowserForAdmission(t, b.URL, a.Token(t, store.RoleRead, "*"))
	if page := br(); !strings.Contains(page, "pending admission: takes no runs until an admin runs <code>gpupass nodes approve "+eu.ID+"</code>") {
		t.Errorf("the dashboard's nodes page does not show %s pending admission:\n%s", eu.ID, page)
	}

	// The dry-run says why the pending node is excluded, and how to admit it.
	dry, err := readB.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := api.ExpandDryRun(dry.Msg); err != nil {
		t.Fatal(err)
	}
	var why []string
	for _, x := range dry.Msg.Excluded {
		if x.Node.GetId() == eu.ID {
			for _, r := range x.Reasons {
				why = append(why, r.Code+": "+r.Message)
			}
		}
	}
	// In the API's terms: the CLI adds its approve command (gpupass's
	// TestBrokerRefusalsNameNoCommand).
	if want := "admission: pending admission (region eu-central-1 admits nodes by approval)"; len(why) != 1 || why[0] != want {
		t.Errorf("dry-run reasons of the pending node = %q, want [%q]", why, want)
	}

	for _, tc := range []struct {
		name string
		c    interface {
			SetAdmission(context.Context, *connect.Request[gpupassv1.SetAdmissionRequest]) (*connect.Response[gpupassv1.SetAdmissionResponse], error)
		}
		id, decision string
		code         connect.Code
	}{
		{"a read token", readA.Node, eu.ID, "approve", connect.CodePermissionDenied},
		{"an admin of us-*", adminUS.Node, eu.ID, "approve", connect.CodeNotFound},
		{"an unknown node", adminEU.Node, "agt-0000000000000000", "approve", connect.CodeNotFound},
		{"a decision that is neither", adminEU.Node, eu.ID, "maybe", connect.CodeInvalidArgument},
	} {
		if _, err := tc.c.SetAdmission(ctx, connect.NewRequest(&gpupassv1.SetAdmissionRequest{NodeId: tc.id, Decision: tc.decision})); brokertest.Code(err) != tc.code {
			t.Errorf("SetAdmission by %s: %v, want %v", tc.name, err, tc.code)
		}
	}
	eventually("after refused decisions", readB.Node, map[string]string{eu.ID: "pending", us.ID: "admitted"})

	resp, err := adminEU.Node.SetAdmission(ctx, connect.NewRequest(&gpupassv1.SetAdmissionRequest{NodeId: eu.ID, Decision: "approve"}))
	if err != nil || resp.Msg.Admission != "admitted" || resp.Msg.Region != "eu-central-1" {
		t.Fatalf("approve through replica a: %v, %v", resp, err)
	}
	eventually("replica b after the approval through a", readB.Node, map[string]string{eu.ID: "admitted", us.ID: "admitted"})
	if _, err := b.Clients(t, a.Token(t, store.RoleAdmin, "*")).Node.SetAdmission(ctx, connect.NewRequest(&gpupassv1.SetAdmissionRequest{NodeId: us.ID, Decision: "deny"})); err != nil {
		t.Fatal(err)
	}
	eventually("replica a after a denial through b (in an open region)", readA.Node, map[string]string{eu.ID: "admitted", us.ID: "denied"})

	// The approved node moves (a proven re-enrollment, then a report
	// from there): pending again.
	moved, err := brokertest.EnrollProven(ctx, a.URL, agentTok, eu.Key, brokertest.H100("eu-west-1", 20))
	if err != nil {
		t.Fatal(err)
	}
	if err := moved.Upload(ctx, nil); err != nil {
		t.Fatal(err)
	}
	eventually("after the approved node moved to eu-west-1", readB.Node, map[string]string{eu.ID: "pending", us.ID: "denied"})
}

// newBrowserForAdmission logs in to the dashboard at base with tok and
// returns a function that fetches its nodes page.
func newBrowserForAdmission(t *testing.T, base, tok string) func() string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(base+"/ui/login", url.Values{"token": {tok}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return func() string {
		t.Helper()
		resp, err := c.Get(base + "/ui/nodes")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
}
