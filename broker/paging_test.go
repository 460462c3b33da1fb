package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/conformance"
)

// pagingFleet stores nodes and runs across three regions straight into
// db (as BenchmarkDashboard does) and returns the ids by region. Every
// third pair of runs shares a creation time, so the keyset's id
// tie-break is exercised.
func pagingFleet(t *testing.T, db brokertest.DB, nodes, runs int) (nodeIDs map[string][]string, runRegion map[string]string, runOrder []string) {
	t.Helper()
	s := db.Open(t)
	ctx := context.Background()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pem, _ := conformance.PublicKeyPEM(key)
	now := time.Now()
	regs := []string{"us-west-2", "us-east-1", "eu-central-1"}
	nodeIDs, runRegion = map[string][]string{}, map[string]string{}
	var beats []store.Heartbeat
	for i := range nodes {
		// Ids not in insertion order, so id order is the broker's doing.
		id := fmt.Sprintf("agt-page%03d", (i*37)%nodes)
		region := regs[i%len(regs)]
		a := store.Agent{ID: id, PublicKeyPEM: pem, KeyFingerprint: id, EnrolledAt: now, Labels: store.Labels{Provider: "t", Region: region}}
		if _, _, err := s.EnrollAgent(ctx, a, nil); err != nil {
			t.Fatal(err)
		}
		ix := store.NodeIndex{Provider: "t", Region: region, Accelerator: "h100-sxm5", GPUCount: 8,
			RuntimeFingerprint: fmt.Sprintf("sha256:fp%d", i%2), Passed: true, GeneratedAt: now}
		if err := s.SaveReport(ctx, store.Report{AgentID: id, Bytes: []byte("{}"), Signature: "t", ReceivedAt: now, Index: ix}); err != nil {
			t.Fatal(err)
		}
		beats = append(beats, store.Heartbeat{AgentID: id, At: now, RTTMS: 1})
		nodeIDs[region] = append(nodeIDs[region], id)
		nodeIDs["*"] = append(nodeIDs["*"], id)
	}
	if err := s.RecordHeartbeats(ctx, beats); err != nil {
		t.Fatal(err)
	}
	rs := s.(store.Runs)
	t0 := now.Add(-time.Hour).Truncate(time.Second)
	type run struct {
		id string
		at time.Time
	}
	var all []run
	for i := range runs {
		at := t0.Add(time.Duration(i/2*3) * time.Second)
		if i%6 >= 2 {
			at = at.Add(time.Duration(i%2) * time.Millisecond)
		}
		id := fmt.Sprintf("alloc-%08x", (i*7919)%100003)
		region := regs[i%len(regs)]
		a := store.Alloc{ID: id, Name: "page", Region: region, State: store.AllocSucceeded, SpecJSON: []byte("{}"), CreatedAt: at}
		if err := rs.CreateAlloc(ctx, a); err != nil {
			t.Fatal(err)
		}
		all = append(all, run{id, at})
		runRegion[id] = region
	}
	slices.SortFunc(all, func(a, b run) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return strings.Compare(b.id, a.id)
	})
	for _, r := range all {
		runOrder = append(runOrder, r.id)
	}
	return nodeIDs, runRegion, runOrder
}

// pageNodes follows next_page_token to the end and returns the ids in
// the order served, failing on a page larger than asked for.
func pageNodes(t *testing.T, c *lister, m *gpupassv1.ListNodesRequest) []string {
	t.Helper()
	var ids []string
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("paging does not end")
		}
		resp, err := c.Node.ListNodes(context.Background(), connect.NewRequest(m))
		if err != nil {
			t.Fatalf("ListNodes page %d: %v", pages+1, err)
		}
		if len(resp.Msg.Nodes) > int(m.PageSize) {
			t.Fatalf("page of %d nodes, asked for %d", len(resp.Msg.Nodes), m.PageSize)
		}
		for _, n := range resp.Msg.Nodes {
			ids = append(ids, n.Id)
		}
		if resp.Msg.NextPageToken == "" {
			return ids
		}
		m.PageToken = resp.Msg.NextPageToken
	}
}

func pageRuns(t *testing.T, c *lister, m *gpupassv1.ListRunsRequest) (ids, regions []string) {
	t.Helper()
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("paging does not end")
		}
		resp, err := c.Run.ListRuns(context.Background(), connect.NewRequest(m))
		if err != nil {
			t.Fatalf("ListRuns page %d: %v", pages+1, err)
		}
		for _, r := range resp.Msg.Runs {
			ids = append(ids, r.Id)
			regions = append(regions, r.Region)
		}
		if resp.Msg.NextPageToken == "" {
			return ids, regions
		}
		m.PageToken = resp.Msg.NextPageToken
	}
}

// forge rewrites a page token's fields and re-computes its checksum, as
// a caller who read the encoding could: the broker must still refuse a
// position outside the caller's view.
func forge(t *testing.T, tok string, edit func(map[string]any)) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b[:len(b)-8], &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	body, _ := json.Marshal(m)
	sum := sha256.Sum256(body)
	return base64.RawURLEncoding.EncodeToString(append(body, sum[:8]...))
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestListPaging pages ListNodes and ListRuns to the end on both stores:
// each node or run comes exactly once, in id order (nodes) or newest
// first (runs), a scoped token's pages hold its regions only, and a
// page token that was altered, forged to another position, replayed
// with other filters or by another token is refused.
func TestListPaging(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			db := brokertest.NewDB(t, kind)
			const nNodes, nRuns = 230, 250
			nodeIDs, runRegion, runOrder := pagingFleet(t, db, nNodes, nRuns)
			b := brokertest.Start(t, db, broker.Config{OfflineAfter: time.Hour})
			all := newLister(t, b, b.Token(t, store.RoleRead, "*"))
			us := newLister(t, b, b.Token(t, store.RoleRead, "us-*"))
			ctx := context.Background()

			// Callers that send no page size get what they always got.
			old, err := all.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true}))
			if err != nil || len(old.Msg.Nodes) != nNodes || old.Msg.NextPageToken != "" {
				t.Fatalf("ListNodes without page_size: %d nodes, token %q, %v; want all %d, no token", len(old.Msg.GetNodes()), old.Msg.GetNextPageToken(), err, nNodes)
			}
			oldRuns, err := all.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
			if err != nil || len(oldRuns.Msg.Runs) != 100 || oldRuns.Msg.Runs[0].Id != runOrder[0] {
				t.Fatalf("ListRuns without limit: %d runs, %v; want the newest 100", len(oldRuns.Msg.GetRuns()), err)
			}

			t.Run("nodes", func(t *testing.T) {
				for _, tc := range []struct {
					name string
					c    *lister
					m    *gpupassv1.ListNodesRequest
					want []string
				}{
					{"all", all, &gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 100}, nodeIDs["*"]},
					{"all by 7", all, &gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 7}, nodeIDs["*"]},
					{"eu filter", all, &gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 9, Regions: []string{"eu-*"}}, nodeIDs["eu-central-1"]},
					{"us scope", us, &gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 11}, append(slices.Clone(nodeIDs["us-west-2"]), nodeIDs["us-east-1"]...)},
				} {
					if diff := cmp.Diff(sorted(tc.want), pageNodes(t, tc.c, tc.m)); diff != "" {
						t.Errorf("%s: paged node ids (-want +got):\n%s", tc.name, diff)
					}
				}
				fp, err := all.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 1000, RuntimeFingerprint: "sha256:fp1"}))
				if err != nil || fp.Msg.TotalSize != nNodes/2 || len(fp.Msg.Nodes) != nNodes/2 || !slices.Equal(fp.Msg.FacetRuntimeFingerprints, []string{"sha256:fp0", "sha256:fp1"}) {
					t.Errorf("fingerprint filter: %d nodes of total %d, facets %v, %v; want %d", len(fp.Msg.GetNodes()), fp.Msg.GetTotalSize(), fp.Msg.GetFacetRuntimeFingerprints(), err, nNodes/2)
				}
				usFirst, err := us.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 5}))
				if err != nil || !slices.Equal(usFirst.Msg.FacetRegions, []string{"us-east-1", "us-west-2"}) {
					t.Errorf("us token's region facets %v, %v; want its two regions only", usFirst.Msg.GetFacetRegions(), err)
				}
			})

			t.Run("runs", func(t *testing.T) {
				ids, _ := pageRuns(t, all, &gpupassv1.ListRunsRequest{Limit: 40})
				if diff := cmp.Diff(runOrder, ids); diff != "" {
					t.Errorf("paged runs, newest first (-want +got):\n%s", diff)
				}
				ids, regions := pageRuns(t, us, &gpupassv1.ListRunsRequest{Limit: 13})
				for _, r := range slices.Compact(sorted(regions)) {
					if !strings.HasPrefix(r, "us-") {
						t.Errorf("us-only token paged to a run in %s", r)
					}
				}
				var want []string
				for _, id := range runOrder {
					if strings.HasPrefix(runRegion[id], "us-") {
						want = append(want, id)
					}
				}
				if diff := cmp.Diff(want, ids); diff != "" {
					t.Errorf("us token's paged runs (-want +got):\n%s", diff)
				}
			})

			t.Run("page tokens are validated", func(t *testing.T) {
				nodesTok := func(c *lister, m *gpupassv1.ListNodesRequest) string {
					resp, err := c.Node.ListNodes(ctx, connect.NewRequest(m))
					if err != nil || resp.Msg.NextPageToken == "" {
						t.Fatalf("first page: token %q, %v", resp.Msg.GetNextPageToken(), err)
					}
					return resp.Msg.NextPageToken
				}
				runsTok := func(c *lister) (string, []*gpupassv1.Run) {
					resp, err := c.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Limit: 5}))
					if err != nil || resp.Msg.NextPageToken == "" {
						t.Fatalf("first page: token %q, %v", resp.Msg.GetNextPageToken(), err)
					}
					return resp.Msg.NextPageToken, resp.Msg.Runs
				}
				allTok := nodesTok(all, &gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 5})
				usTok := nodesTok(us, &gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 5})
				usRunTok, _ := runsTok(us)
				allRunTok, _ := runsTok(all)
				euRun := ""
				for _, id := range runOrder {
					if runRegion[id] == "eu-central-1" {
						euRun = id
						break
					}
				}
				flip := func(s string) string {
					b := []byte(s)
					i := len(b) / 2
					b[i] = "AB"[boolIdx(b[i] == 'A')]
					return string(b)
				}
				for _, tc := range []struct {
					name, want string
					call       func() error
				}{
					{"altered node token", "was altered", func() error {
						_, err := all.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 5, PageToken: flip(allTok)}))
						return err
					}},
					{"node token of another caller", "to another token", func() error {
						_, err := us.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 5, PageToken: allTok}))
						return err
					}},
					{"node token with other filters", "other filters", func() error {
						_, err := all.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 5, PageToken: allTok, Regions: []string{"eu-*"}}))
						return err
					}},
					{"node token forged to an eu node", "not one of your rows", func() error {
						tok := forge(t, usTok, func(m map[string]any) { m["i"] = nodeIDs["eu-central-1"][0] })
						_, err := us.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: 5, PageToken: tok}))
						return err
					}},
					{"run token forged to an eu run", "not one of your rows", func() error {
						tok := forge(t, usRunTok, func(m map[string]any) { m["i"] = euRun })
						_, err := us.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Limit: 5, PageToken: tok}))
						return err
					}},
					{"run token forged to another time", "not one of your rows", func() error {
						tok := forge(t, allRunTok, func(m map[string]any) { m["t"] = m["t"].(float64) - 1e12 })
						_, err := all.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Limit: 5, PageToken: tok}))
						return err
					}},
					{"run token of another caller", "to another token", func() error {
						_, err := us.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Limit: 5, PageToken: allRunTok}))
						return err
					}},
					{"node token sent to ListRuns", "not a runs one", func() error {
						_, err := all.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Limit: 5, PageToken: allTok}))
						return err
					}},
					{"garbage", "not one the broker issued", func() error {
						_, err := all.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Limit: 5, PageToken: "not a token!"}))
						return err
					}},
				} {
					err := tc.call()
					if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "without page_token") {
						t.Errorf("%s: %v; want invalid_argument saying %q and how to start over", tc.name, err, tc.want)
					}
				}
			})
		})
	}
}

// lister holds a caller's node and run clients.
type lister struct {
	Node gpupassv1connect.NodeServiceClient
	Run  gpupassv1connect.RunServiceClient
}

func newLister(t *testing.T, b *brokertest.Broker, token string) *lister {
	return &lister{Node: b.Clients(t, token).Node, Run: dialRuns(t, b, token).Run}
}

func boolIdx(b bool) int {
	if b {
		return 1
	}
	return 0
}
