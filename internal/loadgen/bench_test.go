package loadgen_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/loadgen"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
	"github.com/gpupass/gpupass/internal/testutil/promtest"
)

// benchScale is GPUPASS_BENCH_FLEET_SCALE, the fraction of issue #21's
// fleet to simulate (default 0.05; 1 is the whole goal).
func benchScale(b *testing.B) float64 {
	s := 0.05
	if v := os.Getenv("GPUPASS_BENCH_FLEET_SCALE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f > 1 {
			b.Fatalf("GPUPASS_BENCH_FLEET_SCALE=%q: want a number in (0, 1]", v)
		}
		s = f
	}
	return s
}

// BenchmarkFleet: three gpupass-broker processes on one PostgreSQL, a
// simulated fleet spread over them (internal/loadgen in this process).
// The goal is 20,000 agents beating every 10 s (2,000 beats/s) and 200
// runs × 100 lines/s; at scale s it is 20,000·s agents beating every
// 10·s seconds (the same 2,000 beats/s, ~667 per broker, on a registry
// s times the size) and max(1, 200·s) runs at the same 100 lines/s each
// (s times the line rate), each also writing 10 metric points a second to
// its metrics file as a training loop does. Run once (-benchtime 1x).
//   - steady: the load alone;
//   - kill9: the same, and 10 s after the runs start one broker (not
//     the submitters') gets SIGKILL. Agents are given every broker, their
//     own first, and must move by themselves (the client's multi-URL
//     failover). GPUPASS_BENCH_FLEET_FAILOVER=0 leaves it out.
func BenchmarkFleet(b *testing.B) {
	for _, kill := range []bool{false, true} {
		name := "steady"
		if kill {
			name = "kill9"
		}
		b.Run(name, func(b *testing.B) {
			if kill && os.Getenv("GPUPASS_BENCH_FLEET_FAILOVER") == "0" {
				b.Skip("GPUPASS_BENCH_FLEET_FAILOVER=0")
			}
			fleet(b, kill)
		})
	}
}

func fleet(b *testing.B, kill bool) {
	s := benchScale(b)
	agents := int(math.Round(20000 * s))
	runs := max(1, int(math.Round(200*s)))
	every := time.Duration(float64(10*time.Second) * s)
	const streamSeconds, brokers = 20, 3

	dsn := pgtest.NewDatabase(b)
	st := brokertest.DB{Kind: "postgres", DSN: dsn}.Open(b)
	token := func(role store.Role) string {
		secret, _, err := broker.CreateToken(context.Background(), st, role, []string{"*"}, "loadgen")
		if err != nil {
			b.Fatal(err)
		}
		return secret
	}
	bin := testutil.BuildBinary(b, "./cmd/gpupass-broker")
	var urls []string
	var procs []*exec.Cmd
	for i := 0; i < brokers; i++ {
		u, cmd := startBroker(b, bin, dsn)
		urls, procs = append(urls, u), append(procs, cmd)
	}
	cfg := loadgen.Config{
		BrokerURLs: urls, AgentToken: token(store.RoleAgent), SubmitToken: token(store.RoleSubmit), ReadToken: token(store.RoleRead),
		Agents: agents, Runs: runs, HeartbeatEvery: every, Duration: 30 * time.Second,
		LinesPerSecond: 100, Lines: 100 * streamSeconds, MetricsPerSecond: 10, Submitters: 1, DryRunEvery: time.Second,
		Emitter: []string{os.Args[0], "emit"}, StateDir: b.TempDir(), Failover: kill,
	}
	// How much of the machine each side took while under load, from the
	// runs' submission to the end of the heartbeat window: the brokers,
	// PostgreSQL (postmaster and backends), and the load generator (this
	// process and its emitters, the brokers' share taken out).
	pg := pgtest.ServerPID(b)
	sample := func() (at time.Time, brokersCPU, pgCPU, genCPU time.Duration) {
		at = time.Now()
		for _, p := range procs {
			c, err := testutil.TreeCPU(p.Process.Pid)
			if err != nil {
				b.Fatalf("broker %d's CPU: %v", p.Process.Pid, err)
			}
			brokersCPU += c
		}
		var err error
		if pgCPU, err = testutil.TreeCPU(pg); err != nil {
			b.Fatalf("PostgreSQL's CPU: %v", err)
		}
		self, err := testutil.TreeCPU(os.Getpid())
		if err != nil {
			b.Fatalf("the load generator's CPU: %v", err)
		}
		return at, brokersCPU, pgCPU, self - brokersCPU
	}
	var t0 time.Time
	var brokers0, pg0, gen0 time.Duration
	// The brokers' own time per heartbeat (their rpc_duration_seconds)
	// while the runs stream, from the brokers that live to its end: what
	// of the latency the load generator measures is the brokers' handling
	// and what is the trip and the wait for a CPU on the shared machine.
	served := urls
	if kill {
		served = urls[:brokers-1]
	}
	var beats0, beats1 map[float64]uint64
	cfg.StreamingDone = func() { beats1 = beatBuckets(b, served, cfg.ReadToken) }
	cfg.During = func(ctx context.Context) {
		t0, brokers0, pg0, gen0 = sample()
		beats0 = beatBuckets(b, served, cfg.ReadToken)
		if !kill {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
		}
		// Submitters and followers use the first broker; the last dies.
		// A killed broker stays a zombie until the benchmark's cleanup
		// waits for it, so its CPU still reads.
		if err := procs[brokers-1].Process.Kill(); err != nil {
			b.Error(err)
		}
	}
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		res, err := loadgen.Run(ctx, cfg)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		t1, brokers1, pg1, gen1 := sample()
		b.ReportMetric(quantile(beats1, beats0, 0.99)*1000, "hb-broker-p99-ms")
		wall := t1.Sub(t0).Seconds()
		b.ReportMetric((brokers1-brokers0).Seconds()/wall, "broker-cores")
		b.ReportMetric((pg1-pg0).Seconds()/wall, "pg-cores")
		b.ReportMetric((gen1-gen0).Seconds()/wall, "gen-cores")
		b.Logf("%+v", *res)
		b.ReportMetric(float64(res.Agents+res.Runs), "agents")
		b.ReportMetric(res.HeartbeatsPerSec, "beats/s")
		b.ReportMetric(res.Heartbeats.P50, "hb-p50-ms")
		b.ReportMetric(res.Heartbeats.P99, "hb-p99-ms")
		b.ReportMetric(res.HeartbeatsStreaming.P50, "hb-streaming-p50-ms")
		b.ReportMetric(res.HeartbeatsStreaming.P99, "hb-streaming-p99-ms")
		b.ReportMetric(float64(res.HeartbeatErrors), "hb-errors")
		b.ReportMetric(res.MaxBeatGap.Seconds(), "max-beat-gap-s")
		b.ReportMetric(every.Seconds(), "beat-every-s")
		b.ReportMetric(float64(res.Runs), "runs")
		b.ReportMetric(res.StoredPerSecond, "lines/s")
		b.ReportMetric(res.LineLatency.P50, "line-p50-ms")
		b.ReportMetric(res.LineLatency.P99, "line-p99-ms")
		b.ReportMetric(res.LineLatency.Max, "line-max-ms")
		b.ReportMetric(float64(res.LinesLost), "lost")
		b.ReportMetric(float64(res.LinesDuplicated), "dup")
		b.ReportMetric(float64(res.MetricsStored), "points")
		b.ReportMetric(float64(res.MetricsLost), "points-lost")
		b.ReportMetric(float64(res.MetricsDuplicated), "points-dup")
		b.ReportMetric(float64(len(res.RunsFailed)), "runs-failed")
		b.ReportMetric(res.DryRuns.P95, "dryrun-p95-ms")
	}
}

// beatBuckets sums the brokers' histograms of the Heartbeat call's
// duration: cumulative counts by upper bound in seconds.
func beatBuckets(b *testing.B, urls []string, token string) map[float64]uint64 {
	out := map[float64]uint64{}
	for _, u := range urls {
		fams := promtest.Parse(b, promtest.Scrape(b, u+"/metrics", token))
		bk := promtest.Buckets(fams, "gpupass_broker_rpc_duration_seconds", "procedure="+gpupassv1connect.AgentServiceHeartbeatProcedure)
		if len(bk) == 0 {
			b.Fatalf("%s/metrics: no Heartbeat in gpupass_broker_rpc_duration_seconds", u)
		}
		for ub, n := range bk {
			out[ub] += n
		}
	}
	return out
}

// quantile is q of the observations between two reads of cumulative
// buckets, interpolated within its bucket as PromQL's histogram_quantile
// does (the highest finite bound when it falls in +Inf; NaN for none).
func quantile(now, before map[float64]uint64, q float64) float64 {
	bounds := slices.Sorted(maps.Keys(now))
	total := now[math.Inf(1)] - before[math.Inf(1)]
	if total == 0 {
		return math.NaN()
	}
	rank := q * float64(total)
	lower, below := 0.0, 0.0
	for _, ub := range bounds {
		cum := float64(now[ub] - before[ub])
		if cum >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			if cum == below {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/(cum-below)
		}
		lower, below = ub, cum
	}
	return lower
}

var servingURL = regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)

// startBroker runs `gpupass-broker serve` on dsn, on a free loopback
// port, with no per-run record rate limit (capacity, not policy), and
// returns its URL once it serves, and the process.
func startBroker(b *testing.B, bin, dsn string) (string, *exec.Cmd) {
	b.Helper()
	cmd := exec.Command(bin, "serve", "--db", dsn, "--listen", "127.0.0.1:0", "--run-max-records-per-second", "-1")
	cmd.Env = append(os.Environ(), "GPUPASS_RUN_LOG_LINES_PER_SECOND=-1", "GPUPASS_RUN_MAX_RECORDS_PER_SECOND=-1")
	errs, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(errs)
		for sc.Scan() {
			if m := servingURL.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
				break
			}
			if strings.Contains(sc.Text(), "level=ERROR") {
				fmt.Fprintln(os.Stderr, sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, errs)
	}()
	select {
	case u := <-found:
		return u, cmd
	case <-time.After(30 * time.Second):
		b.Fatal("gpupass-broker did not say where it serves within 30 s")
		return "", nil
	}
}

// TestQuantile: the bench's reading of histogram deltas matches
// histogram_quantile's interpolation.
func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	before := map[float64]uint64{0.001: 10, 0.0025: 10, 0.005: 10, 0.01: 10, inf: 10}
	now := map[float64]uint64{0.001: 60, 0.0025: 100, 0.005: 109, 0.01: 110, inf: 110}
	for _, c := range []struct{ q, want float64 }{{0.5, 0.001}, {0.25, 0.0005}, {0.99, 0.005}, {0.7, 0.001 + 0.0015*0.5}} {
		if got := quantile(now, before, c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q%v = %v, want %v", c.q, got, c.want)
		}
	}
	over := map[float64]uint64{0.001: 0, 0.01: 1, inf: 100}
	if got := quantile(over, map[float64]uint64{}, 0.99); got != 0.01 {
		t.Errorf("q0.99 in +Inf = %v, want the highest finite bound 0.01", got)
	}
	if got := quantile(before, before, 0.99); !math.IsNaN(got) {
		t.Errorf("no observations: %v, want NaN", got)
	}
}
