package broker_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
)

// BenchmarkRecordIngest measures events per second stored through
// UploadRecords on loopback: agents (gRPC, like gpupass-agent) each ship
// one running allocation's events in batches of 2048 (the uploader's
// default), every batch acknowledged before the next. b.N is the number
// of events per agent.
func BenchmarkRecordIngest(b *testing.B) {
	for _, kind := range brokertest.Stores {
		for _, agents := range []int{1, 4} {
			b.Run(fmt.Sprintf("store=%s/agents=%d", kind, agents), func(b *testing.B) {
				cfg := brokertest.Fast()
				// Capacity, not policy: one run here sends far more than
				// the per-run rate limit (quota.go) lets a real run send.
				cfg.RunMaxRecordsPerSecond = -1
				br := brokertest.Start(b, brokertest.NewDB(b, kind), cfg)
				tok := br.Token(b, store.RoleAgent, "*")
				sub, err := client.DialRuns(br.URL, client.Options{Token: br.Token(b, store.RoleSubmit, "*")})
				if err != nil {
					b.Fatal(err)
				}
				spec := mustRead(b, "testdata/h100.yaml")
				type lease struct {
					w  *brokertest.Agent
					c  *client.RunClients
					as *gpupassv1.Assignment
				}
				var leases []lease
				ctx := context.Background()
				for i := 0; i < agents; i++ {
					a := brokertest.Register(b, br.URL, tok, brokertest.H100(fmt.Sprintf("us-bench-%d", i), 20))
					c := a.Runs(b, br.URL, tok)
					if _, err := sub.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: spec,
						Region: a.Node.Region, Command: []string{"true"}})); err != nil {
						b.Fatal(err)
					}
					resp, err := c.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: a.ID, WaitSeconds: 5}))
					if err != nil || resp.Msg.Assignment == nil {
						b.Fatalf("no assignment: %v", err)
					}
					leases = append(leases, lease{a, c, resp.Msg.Assignment})
				}
				// Typical executor events: one stdout line each (~170 bytes of JSON).
				batches := make([][]*gpupassv1.Record, 0, b.N/2048+1)
				for seq := 1; seq <= b.N; seq += 2048 {
					var batch []*gpupassv1.Record
					for s := seq; s < seq+2048 && s <= b.N; s++ {
						batch = append(batch, &gpupassv1.Record{Seq: uint64(s), Kind: gpupassv1.RecordKind_RECORD_KIND_EVENT,
							Data: fmt.Appendf(nil, `{"ts":"2026-11-29T12:00:00.125Z","level":"INFO","component":"trainer","msg":"epoch 3 step %d loss=1.2345 lr=0.0003 tokens/s=81234"}`, s)})
					}
					batches = append(batches, batch)
				}
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for _, l := range leases {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for _, batch := range batches {
							resp, err := l.c.Work.UploadRecords(ctx, connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: l.w.ID,
								AllocId: l.as.AllocId, FencingToken: l.as.FencingToken, Records: batch}))
							if err != nil || resp.Msg.HeldThrough != batch[len(batch)-1].Seq {
								b.Errorf("upload: %v", err)
								return
							}
						}
					}()
				}
				wg.Wait()
				el := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N*agents)/el.Seconds(), "events/s")
			})
		}
	}
}

// BenchmarkSubmitToAssignment measures Submit returning to the agent's
// pending long poll receiving the assignment, on loopback, one node: with
// no webhook, and with one whose endpoint hangs every attempt to its
// 10 s timeout (issue #35: a failing endpoint never slows placement).
// Each run is ended, so each ends a group and queues a delivery.
func BenchmarkSubmitToAssignment(b *testing.B) {
	for _, hook := range []string{"none", "hanging"} {
		b.Run("webhook="+hook, func(b *testing.B) { benchSubmitToAssignment(b, hook == "hanging") })
	}
}

func benchSubmitToAssignment(b *testing.B, hangingHook bool) {
	cfg := brokertest.Fast()
	cfg.Webhooks = broker.WebhookConfig{Sweep: 50 * time.Millisecond, Settle: 20 * time.Millisecond}
	br := brokertest.Start(b, brokertest.NewDB(b, "sqlite"), cfg)
	var called atomic.Int64
	if hangingHook {
		release := make(chan struct{})
		hung := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			called.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		b.Cleanup(hung.Close)
		b.Cleanup(func() { close(release) })
		if _, err := broker.AddWebhook(context.Background(), br.Store, hung.URL, []byte("0123456789abcdef-bench-secret"), nil); err != nil {
			b.Fatal(err)
		}
	}
	tok := br.Token(b, store.RoleAgent, "*")
	a := brokertest.Register(b, br.URL, tok, brokertest.H100("us-west-2", 20))
	c := a.Runs(b, br.URL, tok)
	sub, err := client.DialRuns(br.URL, client.Options{Token: br.Token(b, store.RoleSubmit, "*")})
	if err != nil {
		b.Fatal(err)
	}
	spec := mustRead(b, "testdata/h100.yaml")
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		got := make(chan *gpupassv1.Assignment, 1)
		go func() {
			resp, err := c.Work.PollWork(ctx, connect.NewRequest(&gpupassv1.PollWorkRequest{AgentId: a.ID, WaitSeconds: 10}))
			if err != nil {
				b.Error(err)
			}
			got <- resp.Msg.GetAssignment()
		}()
		time.Sleep(2 * time.Millisecond) // let the poll reach its wait
		start := time.Now()
		if _, err := sub.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: spec,
			Region: "us-west-2", Command: []string{"true"}})); err != nil {
			b.Fatal(err)
		}
		as := <-got
		lat = append(lat, time.Since(start))
		if as == nil {
			b.Fatal("no assignment")
		}
		// Finish it so the node is free for the next one.
		if _, err := c.Work.UpdateAllocation(ctx, connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: a.ID, AllocId: as.AllocId,
			FencingToken: as.FencingToken, State: gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED})); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(testutil.Percentile(lat, 0.50), "p50-ms")
	b.ReportMetric(testutil.Percentile(lat, 0.95), "p95-ms")
	if hangingHook && called.Load() == 0 && b.N >= 100 {
		b.Error("the hanging webhook endpoint was never called: the figure shows nothing about it")
	}
}
