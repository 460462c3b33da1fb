package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil"
)

var regions = []string{"us-west-2", "us-east-1", "eu-central-1", "eu-west-1", "ap-south-1", "ap-northeast-1"}

// populate registers n nodes straight into the store (enrollment, a
// verified-shape report index, a heartbeat): the API path is measured by
// the benchmarks, not by the fixture.
func populate(b testing.TB, s store.Store, n int) *ecdsa.PrivateKey {
	b.Helper()
	ctx := context.Background()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pem, _ := conformance.PublicKeyPEM(key)
	now := time.Now()
	beats := make([]store.Heartbeat, 0, n)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("agt-bench%06d", i)
		region := regions[i%len(regions)]
		spec := brokertest.H100(region, 18+float64(i%13))
		if i%7 == 0 {
			spec.CUDA = "12.2.140"
		}
		if i%5 == 0 {
			spec.Class, spec.Count = "a100-80gb", 4
		}
		a := store.Agent{ID: id, PublicKeyPEM: pem, KeyFingerprint: id, EnrolledAt: now,
			Labels: store.Labels{Provider: "bench", Region: region, PricePerHour: spec.Price, StorageClass: spec.StorageClass, BandwidthGbps: spec.BandwidthGbps}}
		if _, _, err := s.EnrollAgent(ctx, a, nil); err != nil {
			b.Fatal(err)
		}
		ix := store.NodeIndex{Provider: "bench", Region: region, Accelerator: spec.Class, GPUName: spec.GPUName, GPUCount: spec.Count, GPUMemoryMiB: 81559,
			StorageClass: spec.StorageClass, StorageFreeGB: spec.FreeGB, StorageReadMBps: 5000, BandwidthGbps: spec.BandwidthGbps, PricePerHour: spec.Price,
			Runtime:            conformance.Runtime{NvidiaDriver: spec.Driver, CUDA: spec.CUDA, Python: spec.Python, PyTorch: spec.PyTorch},
			RuntimeFingerprint: "sha256:bench", Simulated: true, Passed: true, GeneratedAt: now}
		if err := s.SaveReport(ctx, store.Report{AgentID: id, Bytes: []byte("{}"), Signature: "bench", ReceivedAt: now, Index: ix}); err != nil {
			b.Fatal(err)
		}
		beats = append(beats, store.Heartbeat{AgentID: id, At: now, RTTMS: float64(i % 40)})
	}
	if err := s.RecordHeartbeats(ctx, beats); err != nil {
		b.Fatal(err)
	}
	return key
}

// BenchmarkDryRun measures dry-run latency over the API (Connect protocol
// on loopback) with 1,000, 10,000 and 100,000 registered nodes, client decoding
// included. Cases:
//   - columns: the CLI's request (DRY_RUN_VIEW_COLUMNS with the score
//     terms left to the client, expanded with api.ExpandDryRun), the
//     default broker configuration;
//   - inline: the API's default view (curl), each excluded node's reasons
//     by index into one table, expanded by the client (api.ExpandDryRun);
//   - expanded: INLINE_EXPANDED, every reason written out per node (the
//     inline view before the table), the peer of inline;
//   - summary: per-reason counts instead of the excluded list;
//   - uncached: columns, with the registry re-read from the store on
//     every call (SnapshotTTL 1 ns);
//   - all: columns with every node listed (DryRunRequest.all), the
//     answer every view gave before the default limit.
//
// Every case but all lists the default limit of candidates and excluded
// nodes (api.DefaultDryRunLimit) and counts the rest.
func BenchmarkDryRun(b *testing.B) {
	for _, kind := range brokertest.Stores {
		for _, n := range []int{1000, 10000, 100000} {
			b.Run(fmt.Sprintf("store=%s/nodes=%d", kind, n), func(b *testing.B) {
				db := brokertest.NewDB(b, kind)
				populate(b, db.Open(b), n)
				// populate wrote every node just now, a burst no running
				// fleet makes: a broker re-indexes whatever changed within
				// the last 2 s (refreshMargin) at each background refresh.
				// Measure the steady state, past that window.
				time.Sleep(2500 * time.Millisecond)
				for _, mode := range []string{"columns", "inline", "expanded", "summary", "uncached", "all"} {
					b.Run(mode, func(b *testing.B) {
						cfg := broker.Config{OfflineAfter: 2 * time.Hour}
						view := gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS
						switch mode {
						case "uncached":
							cfg.SnapshotTTL = time.Nanosecond
						case "inline":
							view = gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE
						case "expanded":
							view = gpupassv1.DryRunView_DRY_RUN_VIEW_INLINE_EXPANDED
						case "summary":
							view = gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY
						}
						srv := brokertest.Start(b, db, cfg)
						c := srv.Clients(b, srv.Token(b, store.RoleRead, "*"))
						// The CLI's request lets the client derive the score terms.
						req := &gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: benchSpec(b)}, View: view,
							DeriveScoreTerms: view == gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, All: mode == "all"}
						ctx := context.Background()
						call := func() (*gpupassv1.DryRunResponse, error) {
							resp, err := c.Node.DryRun(ctx, connect.NewRequest(req))
							if err != nil {
								return nil, err
							}
							return resp.Msg, api.ExpandDryRun(resp.Msg)
						}
						// The answer's size, measured once outside the
						// timed calls (proto.Size walks the whole answer:
						// client work that no client does).
						first, err := c.Node.DryRun(ctx, connect.NewRequest(req))
						if err != nil {
							b.Fatal(err)
						}
						wire := proto.Size(first.Msg)
						if _, err := call(); err != nil { // warm up
							b.Fatal(err)
						}
						lat := make([]time.Duration, 0, b.N)
						var last *gpupassv1.DryRunResponse
						cpu0 := testutil.CPUTime()
						b.ResetTimer()
						for i := 0; i < b.N; i++ {
							t0 := time.Now()
							resp, err := call()
							lat = append(lat, time.Since(t0))
							if err != nil {
								b.Fatal(err)
							}
							last = resp
						}
						b.StopTimer()
						b.ReportMetric(float64(testutil.CPUTime()-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
						if len(last.Candidates) == 0 {
							b.Fatal("no candidates: the fixture does not match the spec")
						}
						// Every node is accounted for, as many are listed
						// as the limit allows, and in the per-node views
						// each excluded one has its reasons.
						if got := int(last.CandidatesTotal) + int(last.ExcludedTotal); got != n {
							b.Fatalf("%d candidates + %d excluded = %d, want %d nodes", last.CandidatesTotal, last.ExcludedTotal, got, n)
						}
						limit := api.DefaultDryRunLimit
						if mode == "all" {
							limit = n
						}
						if want := min(limit, int(last.CandidatesTotal)); len(last.Candidates) != want {
							b.Fatalf("candidates: %d listed of %d, want %d", len(last.Candidates), last.CandidatesTotal, want)
						}
						if want := min(limit, int(last.ExcludedTotal)); mode != "summary" && (len(last.Excluded) != want || len(last.Excluded[0].Reasons) == 0) {
							b.Fatalf("excluded list: %d nodes of %d, want %d, each with reasons", len(last.Excluded), last.ExcludedTotal, want)
						}
						b.ReportMetric(testutil.Percentile(lat, 0.50), "p50-ms")
						b.ReportMetric(testutil.Percentile(lat, 0.95), "p95-ms")
						b.ReportMetric(float64(last.CandidatesTotal), "candidates")
						b.ReportMetric(float64(wire), "answer-bytes")
						// The machine's load beside the figures: on a
						// shared machine the wall times mostly measure it.
						b.ReportMetric(testutil.Load1(), "load1")
					})
				}
			})
		}
	}
}

func benchSpec(b *testing.B) []byte {
	b.Helper()
	return mustRead(b, "testdata/h100.yaml")
}

// BenchmarkHeartbeats measures heartbeats per second one broker sustains:
// 64 concurrent gRPC agents (the agent's protocol: each beat carries an
// HMAC with the node's session key, which the broker checks), 1,000
// enrolled nodes, beats batched to the store as in production. Measured
// after each node's first contact with the broker (reported apart as
// first-beats/s). Client and broker share this machine's CPUs, so the
// client's work is paid here too.
func BenchmarkHeartbeats(b *testing.B) {
	for _, kind := range brokertest.Stores {
		b.Run("store="+kind, func(b *testing.B) {
			db := brokertest.NewDB(b, kind)
			const nodes = 1000
			s := db.Open(b)
			populate(b, s, nodes)
			// Session keys as a proven enrollment on another replica
			// issues them (the enrollment itself is not what is
			// measured): the store holds their verifiers.
			sk, ok := s.(store.SessionKeys)
			if !ok {
				b.Fatalf("%T keeps no session keys", s)
			}
			type session struct {
				key   []byte
				epoch uint64
			}
			sessions := make([]session, nodes)
			for i := range sessions {
				k := make([]byte, api.SessionKeyBytes)
				_, _ = rand.Read(k)
				e, err := sk.RotateSessionKey(context.Background(), fmt.Sprintf("agt-bench%06d", i), api.SessionKeyVerifier(k), time.Now())
				if err != nil {
					b.Fatal(err)
				}
				sessions[i] = session{k, e}
			}
			srv := brokertest.Start(b, db, broker.Config{})
			tok := srv.Token(b, store.RoleAgent, "*")
			const workers = 64
			clients := make([]*client.Clients, workers)
			for i := range clients {
				c, err := client.Dial(srv.URL, client.Options{Token: tok, GRPC: true})
				if err != nil {
					b.Fatal(err)
				}
				clients[i] = c
			}
			// Worker w beats for nodes w, w+64, …: one sender per node,
			// so each node's counter rises as the broker requires.
			const used = nodes - nodes%workers
			type state struct {
				echo    int64
				counter uint64
			}
			states := make([]state, used)
			var failed, stale atomic.Int64
			beat := func(c *client.Clients, n int) {
				st := &states[n]
				st.counter++
				req := &gpupassv1.HeartbeatRequest{AgentId: fmt.Sprintf("agt-bench%06d", n), Counter: st.counter, EchoBrokerTimeUnixNano: st.echo,
					SessionEpoch: sessions[n].epoch}
				req.Mac = api.HeartbeatMAC(sessions[n].key, req)
				// The broker holds only the keys' verifiers: each node's
				// first beat shows it its key.
				resp, err := c.Heartbeat(context.Background(), req, sessions[n].key)
				if err != nil {
					failed.Add(1)
					return
				}
				if resp.StaleEcho {
					stale.Add(1)
				}
				st.echo = resp.BrokerTimeUnixNano
			}
			// First contact, not measured: each node's first beat has no
			// echo yet (not counted) and shows this replica its key (a
			// second call). A node then beats for hours, so the rate of
			// the beats after it is the figure; the first contact's is
			// reported beside it (first-beats/s).
			var wg sync.WaitGroup
			t0 := time.Now()
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int, c *client.Clients) {
					defer wg.Done()
					for n := w; n < used; n += workers {
						beat(c, n)
					}
				}(w, clients[w])
			}
			wg.Wait()
			first := time.Since(t0)
			if failed.Load() > 0 || stale.Load() != used {
				b.Fatalf("first contact: %d of %d beats failed, %d not counted (stale echo), want all %d", failed.Load(), used, stale.Load(), used)
			}
			stale.Store(0)
			var next atomic.Int64
			cpu0 := testutil.CPUTime()
			b.ResetTimer()
			t0 = time.Now()
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int, c *client.Clients) {
					defer wg.Done()
					for k := 0; next.Add(1) <= int64(b.N); k++ {
						beat(c, w+(k*workers)%used)
					}
				}(w, clients[w])
			}
			wg.Wait()
			el := time.Since(t0)
			b.StopTimer()
			b.ReportMetric(float64(testutil.CPUTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/beat")
			if failed.Load() > 0 {
				b.Fatalf("%d heartbeats failed", failed.Load())
			}
			// After its first beat, a node's every beat counts.
			if stale.Load() > 0 {
				b.Fatalf("%d heartbeats not counted (stale echo) after each node's first, want none", stale.Load())
			}
			// The batch writer must keep up: every beat is in the store
			// after a final flush.
			if err := srv.Broker.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(used)/first.Seconds(), "first-beats/s")
			b.ReportMetric(float64(b.N)/el.Seconds(), "beats/s")
		})
	}
}
