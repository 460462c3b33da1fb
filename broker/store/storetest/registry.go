package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/conformance"
)

// A registry of n generated nodes, for the read-back test and the stores'
// registry benchmarks. Each node differs from its neighbours in every
// field a node has, and some carry what a decoder gets wrong most easily:
// strings that JSON escapes (quotes, backslashes, <>&, control and
// non-ASCII characters), fractional and large numbers, the optional
// fields (FailedChecks, GresGPUs) both present and absent, nodes never
// seen and nodes without a report.

var registryRegions = []string{"us-west-2", "us-east-1", "eu-central-1", "eu-west-1", "ap-south-1", "ap-northeast-1"}

// RegistryNode is node i of a generated registry: the agent to enroll,
// its report (HasReport false: none to save) and its heartbeat (zero At:
// never seen).
func RegistryNode(i int) (a store.Agent, r store.Report, hb store.Heartbeat, hasReport bool) {
	id := fmt.Sprintf("agt-reg%06d", i)
	region := registryRegions[i%len(registryRegions)]
	price := 18 + float64(i%13) + 0.25*float64(i%4)
	host := fmt.Sprintf("gpu-%d.%s.example", i, region)
	switch i % 11 {
	case 3:
		host = fmt.Sprintf("rack \"%d\" <b>&\\ \u00e9\u4e2d\t\u2028%d", i%3, i)
	case 7:
		host = ""
	}
	a = store.Agent{ID: id, PublicKeyPEM: []byte("PEM " + id), KeyFingerprint: "fp-" + id, AgentVersion: "v1.2.3",
		TokenID: "tok-reg", EnrolledAt: t0,
		Labels: store.Labels{Provider: []string{"lambda", "coreweave", "on-prem"}[i%3], Region: region, Zone: region + string(rune('a'+i%3)),
			PricePerHour: price, StorageClass: []string{"ultra-nvme", "nvme", ""}[i%3], BandwidthGbps: float64(100 * (1 + i%4)), Hostname: host}}
	if i%17 == 5 {
		return a, r, hb, false // enrolled, no report yet
	}
	ix := store.NodeIndex{
		Provider: a.Labels.Provider, Region: region, Zone: a.Labels.Zone, Hostname: host,
		Accelerator: "h100-sxm5", GPUName: "NVIDIA H100 80GB HBM3", GPUCount: 8, GPUMemoryMiB: 81559,
		StorageClass: a.Labels.StorageClass, StorageFreeGB: 6500.5 - float64(i%100), StorageReadMBps: 5000 + float64(i%7)/8,
		BandwidthGbps: a.Labels.BandwidthGbps, PricePerHour: price,
		Runtime: conformance.Runtime{NvidiaDriver: "535.104.05", CUDADriverAPI: "12.2", CUDA: "12.1.105", Python: "3.10.12",
			PyTorch: "2.1.0+cu121", TorchCUDA: "12.1", CuDNN: "8902", FIPSEnabled: i%9 == 0},
		RuntimeFingerprint: fmt.Sprintf("sha256:%064x", i%50), Simulated: i%2 == 0, Profile: []string{"h100", "", "a100"}[i%3],
		Passed:      i%6 != 1,
		GeneratedAt: t0.Add(time.Duration(i) * time.Millisecond),
	}
	if i%5 == 0 {
		ix.Accelerator, ix.GPUName, ix.GPUCount, ix.GPUMemoryMiB = "a100-80gb", "NVIDIA A100-SXM4-80GB", 4, 1<<40+uint64(i)
	}
	if !ix.Passed {
		ix.FailedChecks = []string{"nccl.allreduce: bus bandwidth 91.5 GB/s < 100 GB/s", fmt.Sprintf("disk.read: \"%d\" MB/s\n<slow> \\ &", i)}
	}
	if i%4 == 2 {
		g := i % 9 // 0 included: a GRES of zero GPUs is not "no GRES"
		ix.GresGPUs = &g
	}
	r = store.Report{AgentID: id, Bytes: []byte(`{"registry":true}`), Signature: "sig", ReceivedAt: t0, Index: ix}
	if i%13 != 4 {
		hb = store.Heartbeat{AgentID: id, At: t0.Add(time.Duration(i) * time.Microsecond), RTTMS: float64(i%40) + 0.125}
	}
	return a, r, hb, true
}

// PopulateRegistry stores the generated registry of n nodes through s's
// own API, with workers concurrent writers.
func PopulateRegistry(tb testing.TB, s store.Store, n, workers int) {
	tb.Helper()
	ctx := context.Background()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		beats []store.Heartbeat
	)
	next := make(chan int)
	for w := 0; w < max(1, workers); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				a, r, hb, hasReport := RegistryNode(i)
				_, _, err := s.EnrollAgent(ctx, a, nil)
				if err == nil && hasReport {
					err = s.SaveReport(ctx, r)
				}
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("node %d: %w", i, err)
				}
				if !hb.At.IsZero() {
					beats = append(beats, hb)
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		tb.Fatalf("populating the registry: %v", first)
	}
	for len(beats) > 0 {
		k := min(len(beats), 10000)
		if err := s.RecordHeartbeats(ctx, beats[:k]); err != nil {
			tb.Fatalf("populating the registry: %v", err)
		}
		beats = beats[k:]
	}
}

// CheckRegistry reports where nodes, as read back from a store, differ
// from the generated registry of n nodes: every field, except UpdatedAt
// (the writer's clock), which must be set.
func CheckRegistry(nodes []store.Node, n int) error {
	if len(nodes) != n {
		return fmt.Errorf("%d nodes read back, want %d", len(nodes), n)
	}
	var diffs []string
	for i, got := range nodes {
		a, r, hb, hasReport := RegistryNode(i)
		want := store.Node{ID: a.ID, Labels: a.Labels, HasReport: hasReport, LastSeen: hb.At, RTTMS: -1, UpdatedAt: got.UpdatedAt}
		if hasReport {
			want.Index = r.Index
		}
		if !hb.At.IsZero() {
			want.RTTMS = hb.RTTMS
		}
		if got.UpdatedAt.IsZero() {
			diffs = append(diffs, fmt.Sprintf("node %d: no UpdatedAt", i))
		}
		if d := cmp.Diff(want, got); d != "" {
			diffs = append(diffs, fmt.Sprintf("node %d (-want +got):\n%s", i, d))
		}
		if len(diffs) >= 3 {
			break
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("registry read back differs:\n%s", strings.Join(diffs, "\n"))
	}
	return nil
}

func runRegistry(t *testing.T, open Factory) {
	// Enough nodes that every generated variant occurs many times over and
	// the read is not a handful of rows; few enough for CI's seconds.
	const n = 1500
	t.Run("registry reads back exactly", func(t *testing.T) {
		t.Parallel()
		s, reopen := open(t)
		PopulateRegistry(t, s, n, 4)
		for _, s := range []store.Store{s, reopen(t)} { // this handle, and a fresh one (a broker starting)
			nodes, err := s.Nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckRegistry(nodes, n); err != nil {
				t.Fatal(err)
			}
		}
	})
}
