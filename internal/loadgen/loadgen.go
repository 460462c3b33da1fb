// Package loadgen drives brokers the way a fleet does, to measure them:
// simulated agents that each enroll with their own key (with proof of
// possession, for a heartbeat session key), upload a signed conformance
// report marked simulated and send MAC'd heartbeats; runner agents that
// run the agent's own run loop (long-poll for work, executor, spool,
// uploader) on commands printing timestamped lines and writing metric
// points to $GPUPASS_METRICS_FILE at set rates, as a training job does; and
// submitters doing dry-runs. Everything goes through the client code the
// agent and the CLI use (internal/client, agent), never hand-rolled HTTP.
//
// At the end every run's log and metrics are read back from the broker
// (which serves them from its store) and each emitted line and metric
// point is counted: lost and duplicated records are reported, not
// inferred. The package measures and reports; it
// asserts nothing about speed.
package loadgen

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/events"
)

// Config says what load to make. Zero values take the defaults noted.
type Config struct {
	// BrokerURLs: agent i talks to BrokerURLs[i % len]; submitters and
	// followers use the first.
	BrokerURLs []string
	// AgentToken enrolls agents; SubmitToken submits runs, follows and
	// reads their logs; ReadToken does dry-runs.
	AgentToken, SubmitToken, ReadToken string
	// InsecureHTTP lets the tokens go over plain http:// to brokers that
	// are not on loopback (client.Options.InsecureHTTP).
	InsecureHTTP bool
	// Agents is how many simulated nodes only heartbeat (and are dry-run
	// candidates); Runs is how many more run one streaming run each.
	Agents, Runs int
	// HeartbeatEvery is each agent's beat interval (default 10 s, as
	// gpupass-agent's).
	HeartbeatEvery time.Duration
	// Duration is how long the heartbeats and dry-runs are measured
	// (default 30 s); the runs start at its beginning.
	Duration time.Duration
	// LinesPerSecond and Lines: each run prints Lines lines at that rate
	// (defaults 100/s and 1,000).
	LinesPerSecond, Lines int
	// MetricsPerSecond: each run also writes metric points at this rate
	// to $GPUPASS_METRICS_FILE, for as long as it prints lines (default
	// 10/s, a training loop logging every step; negative: none).
	MetricsPerSecond int
	// Emitter is the command that prints the lines (see Emit): argv, to
	// which the rates and counts are appended. The cmd/gpupass-loadgen
	// binary's own "emit" subcommand by default.
	Emitter []string
	// Submitters each do a dry-run every DryRunEvery (defaults 1 and 1 s).
	Submitters  int
	DryRunEvery time.Duration
	// Enrolling bounds enrollments in flight (default 16).
	Enrolling int
	// ClientsPerBroker is how many HTTP/2 connections the heartbeating
	// agents of one broker share (default 32): a real agent has its own,
	// but thousands of sockets from one process measure the process.
	ClientsPerBroker int
	// Failover gives every agent all of BrokerURLs, its own first, as one
	// comma-separated list: with the client's multi-URL support (#21) an
	// agent moves to another replica when its own stops answering.
	// Submitters and followers get the list in order.
	Failover bool
	// During, when set, runs alongside the load from the moment the runs
	// are submitted (a benchmark kills a broker from it).
	During func(ctx context.Context)
	// StreamingDone, when set, is called as the last run ends (the end
	// of HeartbeatsStreaming's window).
	StreamingDone func()
	// StateDir holds the runner agents' spools (a temporary directory
	// when empty).
	StateDir string
	Log      *slog.Logger
}

// Latency is a distribution, in milliseconds.
type Latency struct {
	N             int
	P50, P95, P99 float64
	Max           float64
}

// Result is what one load run measured.
type Result struct {
	Agents, Runs int
	RunIDs       []string
	Heartbeats   Latency
	// HeartbeatsStreaming is the beats sent while the runs streamed
	// (from their submission until the last one ended): Heartbeats'
	// window also holds the quiet time before and after.
	HeartbeatsStreaming Latency
	HeartbeatErrors     int64
	// MaxBeatGap is the longest any agent went between two answered
	// heartbeats (at least HeartbeatEvery): after a broker dies, how long
	// its agents took to be heard again elsewhere.
	MaxBeatGap       time.Duration
	DryRuns          Latency
	DryRunErrors     int64
	DryRunCandidates int
	DryRunNodes      int     // candidates and excluded in the last answer
	LineLatency      Latency // emitted by the job until read by a client following the run
	LinesEmitted     int64
	LinesStored      int64 // distinct lines read back from the broker
	LinesLost        int64
	LinesDuplicated  int64
	StoredPerSecond  float64 // lines stored over the runs' wall time
	// Metric points written to the metrics file, and read back from the
	// broker's store as metric records (each by its step).
	MetricsEmitted, MetricsStored, MetricsLost, MetricsDuplicated int64
	RunsSucceeded                                                 int
	RunsFailed                                                    []string // "alloc: state reason"
	EnrollTime                                                    time.Duration
	HeartbeatsPerSec                                              float64
	StreamingDuration                                             time.Duration
}

func (c *Config) defaults() error {
	if len(c.BrokerURLs) == 0 {
		return errors.New("no broker URL")
	}
	if c.Agents < 0 || c.Runs < 0 {
		return fmt.Errorf("agents %d, runs %d: want 0 or more", c.Agents, c.Runs)
	}
	set := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	setD := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	setD(&c.HeartbeatEvery, 10*time.Second)
	setD(&c.Duration, 30*time.Second)
	setD(&c.DryRunEvery, time.Second)
	set(&c.LinesPerSecond, 100)
	set(&c.Lines, 1000)
	if c.MetricsPerSecond == 0 {
		c.MetricsPerSecond = 10
	}
	set(&c.Enrolling, 16)
	set(&c.ClientsPerBroker, 32)
	if c.Submitters < 0 {
		c.Submitters = 0
	}
	if c.Runs > 0 && len(c.Emitter) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding the emitter: %w", err)
		}
		c.Emitter = []string{exe, "emit"}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// SpecYAML is the spec every simulated node matches (an H100 with the
// runtime the simulated reports measure) and every generated run asks
// for; idle agents match it too (dry-run candidates) but sit in another
// region, so runs are placed on runners only (Submit's region). The runs
// benchmarks submit it too.
const SpecYAML = `name: loadgen
runtime:
  cuda: 12.1.105
  nvidia-driver: 535.104.05
  python: 3.10.12
  pytorch: 2.1.0+cu121
security:
  fips-compliant: false
  no-internet-access: false
resources:
  accelerator: h100-sxm5
  count: 1
  storage: {type: standard, size_gb: 10}
`

const (
	runRegion  = "lg-run-1"
	idleRegion = "lg-idle-1"
)

// simAgent is one simulated node.
type simAgent struct {
	id      string
	key     *ecdsa.PrivateKey
	creds   *api.AgentCredentials
	session []byte
	epoch   uint64
	counter uint64
	echo    int64
	gotAt   time.Time
	url     string
	c       *client.Clients
}

// Run makes the load of cfg until it is done or ctx ends, and reports.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	res := &Result{Agents: cfg.Agents, Runs: cfg.Runs}
	// Shared connections per broker (see ClientsPerBroker).
	pools := make([][]*client.Clients, len(cfg.BrokerURLs))
	for i, u := range cfg.BrokerURLs {
		for j := 0; j < cfg.ClientsPerBroker; j++ {
			c, err := client.Dial(cfg.agentURL(i), client.Options{Token: cfg.AgentToken, GRPC: true, UserAgent: "gpupass-loadgen", InsecureHTTP: cfg.InsecureHTTP})
			if err != nil {
				return nil, fmt.Errorf("broker %s: %w", u, err)
			}
			pools[i] = append(pools[i], c)
		}
	}
	total := cfg.Agents + cfg.Runs
	agents := make([]*simAgent, total)
	t0 := time.Now()
	if err := forEach(ctx, total, cfg.Enrolling, func(i int) error {
		b := i % len(cfg.BrokerURLs)
		region := idleRegion
		if i >= cfg.Agents {
			region = runRegion
		}
		a, err := enroll(ctx, pools[b][(i/len(cfg.BrokerURLs))%cfg.ClientsPerBroker], cfg.agentURL(b), region)
		if err != nil {
			return fmt.Errorf("agent %d: %w", i, err)
		}
		agents[i] = a
		return nil
	}); err != nil {
		return nil, err
	}
	res.EnrollTime = time.Since(t0)
	cfg.Log.Info("enrolled", "agents", total, "took", res.EnrollTime)

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var beatMu sync.Mutex
	var beats []time.Duration
	var beatsAt []time.Time // when each of beats was sent
	var beatErrs, maxGap atomic.Int64
	measureUntil := time.Now().Add(cfg.Duration)
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the idle fleet's beats over the interval, as agents
			// that started at different times do; the runners beat at
			// once, since the runs wait for them (below).
			phase := time.Duration(int64(cfg.HeartbeatEvery) * int64(i) / int64(max(total, 1)))
			if i >= cfg.Agents {
				phase = 0
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(phase):
			}
			tick := time.NewTicker(cfg.HeartbeatEvery)
			defer tick.Stop()
			last := time.Now()
			for {
				t := time.Now()
				err := a.beat(ctx)
				d := time.Since(t)
				if ctx.Err() != nil {
					return
				}
				if err == nil {
					if gap := time.Since(last); gap > time.Duration(maxGap.Load()) {
						maxGap.Store(int64(gap)) // racy max: a gap at most one beat short
					}
					last = time.Now()
				}
				if err != nil {
					if beatErrs.Add(1) <= 5 {
						cfg.Log.Warn("heartbeat", "agent", a.id, "err", err)
					}
				} else if t.Before(measureUntil) {
					beatMu.Lock()
					beats, beatsAt = append(beats, d), append(beatsAt, t)
					beatMu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}

	sub, err := client.DialRuns(cfg.agentURL(0), client.Options{Token: cfg.SubmitToken, UserAgent: "gpupass-loadgen", InsecureHTTP: cfg.InsecureHTTP})
	if err != nil {
		return nil, err
	}
	// Runner agents: the agent's own run loop on each.
	stateDir := cfg.StateDir
	if stateDir == "" {
		d, err := os.MkdirTemp("", "gpupass-loadgen-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		stateDir = d
	}
	loopCtx, stopLoops := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	defer func() { stopLoops(); loops.Wait() }()
	for _, a := range agents[cfg.Agents:] {
		src, err := agent.NewBrokerSource(a.url, client.Options{Token: cfg.AgentToken, Agent: a.creds, InsecureHTTP: cfg.InsecureHTTP}, func() string { return a.id }, nil)
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(stateDir, a.id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		l := &agent.RunLoop{Source: src, AgentID: func() string { return a.id }, StateDir: dir,
			Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}}, Log: cfg.Log}
		loops.Add(1)
		go func() { defer loops.Done(); _ = l.Run(loopCtx) }()
	}

	// Submitters: dry-runs of the fleet's spec.
	var dryMu sync.Mutex
	var drys []time.Duration
	var dryErrs atomic.Int64
	var dryCands, dryNodes atomic.Int64
	if cfg.Submitters > 0 {
		rd, err := client.Dial(cfg.agentURL(0), client.Options{Token: cfg.ReadToken, UserAgent: "gpupass-loadgen", InsecureHTTP: cfg.InsecureHTTP})
		if err != nil {
			return nil, err
		}
		for s := 0; s < cfg.Submitters; s++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(cfg.DryRunEvery)
				defer tick.Stop()
				for time.Now().Before(measureUntil) {
					t := time.Now()
					resp, err := rd.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{
						Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: []byte(SpecYAML)}}))
					if err == nil {
						err = api.ExpandDryRun(resp.Msg)
					}
					d := time.Since(t)
					if ctx.Err() != nil {
						return
					}
					if err != nil {
						dryErrs.Add(1)
						cfg.Log.Warn("dry-run", "err", err)
					} else {
						dryMu.Lock()
						drys = append(drys, d)
						dryMu.Unlock()
						// Counted, not listed: the broker lists at most
						// api.DefaultDryRunLimit nodes of each kind.
						dryCands.Store(int64(resp.Msg.CandidatesTotal))
						dryNodes.Store(int64(resp.Msg.CandidatesTotal + resp.Msg.ExcludedTotal))
					}
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
				}
			}()
		}
	}

	// Runs: submitted at once, once the broker they are submitted to
	// counts every runner agent as a candidate, each followed by a client
	// that times its lines.
	if err := awaitRunners(ctx, cfg); err != nil {
		return nil, err
	}
	streamStart := time.Now()
	if cfg.During != nil {
		wg.Add(1)
		go func() { defer wg.Done(); cfg.During(ctx) }()
	}
	runs := make([]string, cfg.Runs)
	var lineMu sync.Mutex
	var lines []time.Duration
	var follow sync.WaitGroup
	finals := make([]*gpupassv1.Run, cfg.Runs)
	for r := 0; r < cfg.Runs; r++ {
		cmd := append(slices.Clone(cfg.Emitter), strconv.Itoa(cfg.LinesPerSecond), strconv.Itoa(cfg.Lines), strconv.Itoa(max(cfg.MetricsPerSecond, 0)))
		// Any health score: a loaded machine's RTTs lower the runners'
		// scores, and what is measured is the brokers, not the threshold.
		anyScore := 0.0
		resp, err := sub.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
			SpecYaml: []byte(SpecYAML), Region: runRegion, Command: cmd, MinHealthScore: &anyScore}))
		if err != nil {
			return nil, fmt.Errorf("submitting run %d: %w", r, err)
		}
		runs[r] = resp.Msg.Run.Id
		follow.Add(1)
		go func() {
			defer follow.Done()
			fin, lat, err := followRun(ctx, sub, runs[r])
			if err != nil {
				cfg.Log.Warn("following", "run", runs[r], "err", err)
			}
			finals[r] = fin
			lineMu.Lock()
			lines = append(lines, lat...)
			lineMu.Unlock()
		}()
	}
	follow.Wait()
	streamEnd := time.Now()
	res.StreamingDuration = streamEnd.Sub(streamStart)
	if cfg.StreamingDone != nil {
		cfg.StreamingDone()
	}
	res.RunIDs = runs
	// Every run's log and metrics, read back once it ended: what the
	// store holds.
	points := metricPoints(cfg.LinesPerSecond, cfg.Lines, max(cfg.MetricsPerSecond, 0))
	for r, id := range runs {
		seen, steps, err := readBack(ctx, sub, id)
		if err != nil {
			return nil, err
		}
		res.LinesEmitted += int64(cfg.Lines)
		res.LinesStored, res.LinesLost, res.LinesDuplicated = tally(seen, cfg.Lines, res.LinesStored, res.LinesLost, res.LinesDuplicated)
		res.MetricsEmitted += int64(points)
		res.MetricsStored, res.MetricsLost, res.MetricsDuplicated = tally(steps, points, res.MetricsStored, res.MetricsLost, res.MetricsDuplicated)
		if f := finals[r]; f != nil && f.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			res.RunsSucceeded++
		} else if f != nil {
			res.RunsFailed = append(res.RunsFailed, fmt.Sprintf("%s: %s %s", id, f.State, f.Reason))
		} else {
			res.RunsFailed = append(res.RunsFailed, id+": no final state")
		}
	}
	if res.StreamingDuration > 0 {
		res.StoredPerSecond = float64(res.LinesStored) / res.StreamingDuration.Seconds()
	}
	// Heartbeats and dry-runs go on for the whole measured window.
	if d := time.Until(measureUntil); d > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	stop()
	wg.Wait()
	res.HeartbeatsStreaming = summarize(sentWithin(beats, beatsAt, streamStart, streamEnd))
	res.Heartbeats, res.HeartbeatErrors, res.MaxBeatGap = summarize(beats), beatErrs.Load(), time.Duration(maxGap.Load())
	res.HeartbeatsPerSec = float64(len(beats)) / cfg.Duration.Seconds()
	res.DryRuns, res.DryRunErrors, res.DryRunCandidates, res.DryRunNodes = summarize(drys), dryErrs.Load(), int(dryCands.Load()), int(dryNodes.Load())
	res.LineLatency = summarize(lines)
	return res, nil
}

// awaitRunners waits until the broker the runs go to (the first) counts
// every runner agent as a candidate for the runs' spec in their region.
// A broker fails a run when no node of its region is live, and it learns
// of a heartbeat another replica took only from the store. It waits about
// a second for that news (the broker's newsDelay), which a replica with a
// slower heartbeat write, or a loaded machine, can exceed: a run
// submitted too soon failed with "never sent a heartbeat" (seen with three
// brokers at a small scale, before the broker waited at all).
func awaitRunners(ctx context.Context, cfg Config) error {
	if cfg.Runs == 0 {
		return nil
	}
	rd, err := client.Dial(cfg.agentURL(0), client.Options{Token: cfg.ReadToken, UserAgent: "gpupass-loadgen", InsecureHTTP: cfg.InsecureHTTP})
	if err != nil {
		return err
	}
	anyScore := 0.0
	var seen int32
	for tick := time.NewTicker(50 * time.Millisecond); ; {
		resp, err := rd.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{
			Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: []byte(SpecYAML)}, Regions: []string{runRegion},
			MinHealthScore: &anyScore, View: gpupassv1.DryRunView_DRY_RUN_VIEW_SUMMARY, Limit: 1}))
		if err == nil {
			if seen = resp.Msg.CandidatesTotal; int(seen) >= cfg.Runs {
				tick.Stop()
				return nil
			}
		}
		select {
		case <-ctx.Done():
			tick.Stop()
			why := fmt.Sprintf("%d so far", seen)
			if err != nil {
				why = "last dry-run: " + err.Error()
			}
			return fmt.Errorf("waiting for the broker to count the %d runner agents as candidates (%s): %w", cfg.Runs, why, ctx.Err())
		case <-tick.C:
		}
	}
}

// agentURL is the broker address of agent pool b: its broker, or with
// Failover every broker, its own first.
func (c *Config) agentURL(b int) string {
	if !c.Failover {
		return c.BrokerURLs[b]
	}
	n := len(c.BrokerURLs)
	urls := make([]string, n)
	for i := range urls {
		urls[i] = c.BrokerURLs[(b+i)%n]
	}
	return strings.Join(urls, ",")
}

// enroll enrolls one simulated node as gpupass-agent does (proof of key
// possession, so beats carry an HMAC) and uploads its signed report.
func enroll(ctx context.Context, c *client.Clients, url, region string) (*simAgent, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	pem, err := conformance.PublicKeyPEM(key)
	if err != nil {
		return nil, err
	}
	fp, err := api.KeyFingerprint(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	req := &gpupassv1.EnrollRequest{PublicKeyPem: pem, AgentVersion: "loadgen",
		Labels: &gpupassv1.NodeLabels{Provider: "loadgen", Region: region, PricePerHour: 20, StorageClass: "standard", BandwidthGbps: 100, Hostname: "sim"}}
	req.ProofTimeUnixNano = time.Now().UnixNano()
	if req.Proof, err = conformance.Sign(key, api.EnrollProofPayload(fp, req.ProofTimeUnixNano)); err != nil {
		return nil, err
	}
	resp, err := c.Agent.Enroll(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, fmt.Errorf("enrolling: %s", api.Describe(err))
	}
	m := resp.Msg
	creds := &api.AgentCredentials{Sign: func(p []byte) (string, error) { return conformance.Sign(key, p) }}
	creds.Set(m.AgentId, m.SessionKey, m.SessionEpoch, m.BrokerTimeUnixNano)
	a := &simAgent{id: m.AgentId, key: key, creds: creds, session: m.SessionKey, epoch: m.SessionEpoch,
		echo: m.BrokerTimeUnixNano, gotAt: time.Now(), url: url, c: c}
	// Two beats measure the node's RTT, as the agent's first minute does.
	for i := 0; i < 2; i++ {
		if err := a.beat(ctx); err != nil {
			return nil, err
		}
	}
	rep := &conformance.Report{
		SchemaVersion: conformance.SchemaVersion, AgentID: a.id, Simulated: true, Profile: "loadgen",
		GeneratedAt: time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		Node:        conformance.Node{Provider: "loadgen", Region: region, PricePerHour: 20, BandwidthGbps: 100, Hostname: "sim"},
		Runtime:     conformance.Runtime{NvidiaDriver: "535.104.05", CUDA: "12.1.105", Python: "3.10.12", PyTorch: "2.1.0+cu121"},
		Storage:     conformance.Storage{Path: "/data", FSType: "xfs", FreeGB: 500, ReadMBps: 2000, Class: "standard"},
		Checks:      []conformance.Check{{Name: "gpu.count", Expected: "1", Actual: "1", Status: conformance.Pass}},
		GPUs: []conformance.GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3", Class: "h100-sxm5", UUID: "GPU-" + a.id,
			MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, PCIeGen: 5, PCIeWidth: 16, NVLinkActive: 18}},
		RuntimeFingerprint: "sha256:loadgen",
	}
	body, err := rep.Marshal()
	if err != nil {
		return nil, err
	}
	sig, err := conformance.Sign(key, body)
	if err != nil {
		return nil, err
	}
	if _, err := c.Agent.UploadReport(ctx, connect.NewRequest(&gpupassv1.UploadReportRequest{AgentId: a.id, Report: body, Signature: sig})); err != nil {
		return nil, fmt.Errorf("uploading the report of %s: %s", a.id, api.Describe(err))
	}
	return a, nil
}

// beat sends one heartbeat as gpupass-agent does: the counter one
// higher, the last broker time echoed, an HMAC with the session key.
func (a *simAgent) beat(ctx context.Context) error {
	a.counter++
	req := &gpupassv1.HeartbeatRequest{AgentId: a.id, Counter: a.counter, EchoBrokerTimeUnixNano: a.echo,
		AgentHoldNanos: int64(time.Since(a.gotAt)), SessionEpoch: a.epoch}
	req.Mac = api.HeartbeatMAC(a.session, req)
	resp, err := a.c.Heartbeat(ctx, req, a.session)
	if err != nil {
		return fmt.Errorf("heartbeat of %s: %s", a.id, api.Describe(err))
	}
	a.echo, a.gotAt = resp.BrokerTimeUnixNano, time.Now()
	a.creds.SawBrokerTime(resp.BrokerTimeUnixNano)
	return nil
}

// followRun follows a run's log until it ends, timing each emitted line
// from the time it carries to its arrival here.
func followRun(ctx context.Context, sub *client.RunClients, id string) (*gpupassv1.Run, []time.Duration, error) {
	st, err := sub.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: id, Follow: true}))
	if err != nil {
		return nil, nil, err
	}
	defer st.Close()
	var lat []time.Duration
	for st.Receive() {
		now := time.Now()
		for _, r := range st.Msg().Records {
			if _, at, ok := parseLine(r.Data); ok {
				lat = append(lat, now.Sub(at))
			}
		}
		if fin := st.Msg().Run; fin != nil {
			return fin, lat, nil
		}
	}
	return nil, lat, fmt.Errorf("log stream of %s ended without a final state: %v", id, st.Err())
}

// tally adds to stored, lost and duplicated the count of want records
// numbered 0..want-1 that seen holds once, not at all, and more than once.
func tally(seen map[int]int, want int, stored, lost, dup int64) (int64, int64, int64) {
	for i := 0; i < want; i++ {
		switch n := seen[i]; {
		case n == 0:
			lost++
		case n > 1:
			dup += int64(n - 1)
			stored++
		default:
			stored++
		}
	}
	return stored, lost, dup
}

// readBack reads a finished run's whole log, metric records included,
// from the broker and counts each emitted line by its number and each
// metric point by its step. Metric records are counted as stored, not
// through GetMetrics, which merges a step logged twice into one point.
func readBack(ctx context.Context, sub *client.RunClients, id string) (lines, steps map[int]int, err error) {
	st, err := sub.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: id, IncludeMetrics: true}))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the log of %s: %w", id, err)
	}
	defer st.Close()
	lines, steps = map[int]int{}, map[int]int{}
	seqs := map[uint64]bool{}
	for st.Receive() {
		for _, r := range st.Msg().Records {
			if seqs[r.Seq] {
				return nil, nil, fmt.Errorf("log of %s: record seq %d sent twice", id, r.Seq)
			}
			seqs[r.Seq] = true
			if r.Kind == gpupassv1.RecordKind_RECORD_KIND_METRIC {
				var m events.Metric
				if err := json.Unmarshal(r.Data, &m); err != nil {
					return nil, nil, fmt.Errorf("log of %s: metric record seq %d: %w", id, r.Seq, err)
				}
				if _, ok := m.Values[metricTag]; ok {
					steps[int(m.Step)]++
				}
				continue
			}
			if n, _, ok := parseLine(r.Data); ok {
				lines[n]++
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading the log of %s: %w", id, err)
	}
	return lines, steps, nil
}

// lineTag starts every line Emit prints: "gpl <n> <unix nanos>".
const lineTag = "gpl "

func parseLine(data []byte) (int, time.Time, bool) {
	var ev events.Event
	if json.Unmarshal(data, &ev) != nil || !strings.HasPrefix(ev.Message, lineTag) {
		return 0, time.Time{}, false
	}
	f := strings.Fields(ev.Message)
	if len(f) != 3 {
		return 0, time.Time{}, false
	}
	n, err1 := strconv.Atoi(f[1])
	ns, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, time.Time{}, false
	}
	return n, time.Unix(0, ns), true
}

// metricTag is a value every point Emit writes carries, so that read-back
// counts only those.
const metricTag = "loadgen"

// metricPoints is how many metric points Emit writes beside count lines
// at rate lines per second: mrate a second for as long as the lines last.
func metricPoints(rate, count, mrate int) int {
	if rate <= 0 || count <= 0 || mrate <= 0 {
		return 0
	}
	return max(1, int(int64(count)*int64(mrate)/int64(rate)))
}

// Emit prints count lines to w at rate lines per second, each numbered
// and stamped with the time it was printed: the job a runner agent runs.
// Alongside, it appends metricPoints(rate, count, mrate) points, one JSON
// line each with its step and a loss, to the file named by metrics (the
// executor's $GPUPASS_METRICS_FILE, as examples/train does), spread over
// the same time; with metrics empty they go to w as "gpupass:metric"
// lines instead.
func Emit(w io.Writer, metrics string, rate, count, mrate int) error {
	if rate <= 0 || count < 0 || mrate < 0 {
		return fmt.Errorf("emit: rate %d, count %d, metrics rate %d: want a rate above 0, a count and a metrics rate of 0 or more", rate, count, mrate)
	}
	bw := bufio.NewWriter(w)
	points := metricPoints(rate, count, mrate)
	var mw io.Writer
	if points > 0 {
		mw = bw
		if metrics != "" {
			f, err := os.OpenFile(metrics, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return fmt.Errorf("emit: %w", err)
			}
			defer f.Close()
			mw = f
		}
	}
	start := time.Now()
	due := func(i, per int) time.Time {
		return start.Add(time.Duration(int64(i) * int64(time.Second) / int64(per)))
	}
	point := 0
	// Points due by now, each a line of its own (written whole: the
	// executor's tail reads complete lines only).
	writePoints := func(until time.Time) error {
		for ; point < points && !due(point, mrate).After(until); point++ {
			prefix := ""
			if metrics == "" {
				prefix = events.MetricMarker + " "
			}
			line := fmt.Sprintf("%s{\"step\": %d, \"loss\": %g, \"%s\": 1}\n", prefix, point, 1/float64(point+1), metricTag)
			if _, err := io.WriteString(mw, line); err != nil {
				return fmt.Errorf("emit: writing metric step %d: %w", point, err)
			}
		}
		return nil
	}
	for i := 0; i < count; i++ {
		// Lines are due at start + i/rate; print what is due, then flush,
		// so a batch never waits behind a timer.
		at := due(i, rate)
		if err := writePoints(at); err != nil {
			return err
		}
		if time.Until(at) > 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
			time.Sleep(time.Until(at))
		}
		if _, err := fmt.Fprintf(bw, "%s%d %d\n", lineTag, i, time.Now().UnixNano()); err != nil {
			return err
		}
	}
	// The rest (rounding leaves points due within the last line's slot).
	if err := writePoints(time.Unix(1<<62, 0)); err != nil {
		return err
	}
	return bw.Flush()
}

// EmitMain is Emit for a command line: RATE COUNT [METRICS_RATE] as
// arguments, the metrics file from $GPUPASS_METRICS_FILE.
func EmitMain(args []string) error {
	if len(args) != 2 && len(args) != 3 {
		return fmt.Errorf("emit: want RATE COUNT [METRICS_RATE], got %q", args)
	}
	args = append(args, "0")
	rate, err1 := strconv.Atoi(args[0])
	count, err2 := strconv.Atoi(args[1])
	mrate, err3 := strconv.Atoi(args[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("emit: %w", err)
	}
	return Emit(os.Stdout, os.Getenv(metricsFileEnv), rate, count, mrate)
}

// metricsFileEnv is executor.EnvMetricsFile, where the executor tells a
// job to write its metrics.
const metricsFileEnv = executor.EnvMetricsFile

// forEach calls f(0..n-1) with at most par in flight; the first error
// stops it.
func forEach(ctx context.Context, n, par int, f func(int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for w := 0; w < min(par, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}

// sentWithin returns, in a new slice, the latencies ds[i] of the calls
// sent (at[i]) in [from, to). Before summarize: it sorts ds.
func sentWithin(ds []time.Duration, at []time.Time, from, to time.Time) []time.Duration {
	var out []time.Duration
	for i, t := range at {
		if !t.Before(from) && t.Before(to) {
			out = append(out, ds[i])
		}
	}
	return out
}

// summarize sorts ds and reads its percentiles.
func summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	at := func(p float64) float64 { return ms(ds[int(float64(len(ds)-1)*p)]) }
	return Latency{N: len(ds), P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: ms(ds[len(ds)-1])}
}
