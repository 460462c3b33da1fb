// Package agent is gpupass-agent, the daemon on each GPU node: it creates
// and keeps the node's ECDSA identity, enrolls with the broker using an
// agent token, heartbeats, runs the conformance suite at start, on a
// timer and on demand, and uploads each signed report. It serves a small
// local HTTP endpoint (loopback by default) that answers "what is this
// node's runtime fingerprint right now".
//
// It dials out only; the broker never dials it. It stays small: no cosign,
// no forge clients, no broker code (internal/depcheck enforces it).
package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpupass/gpupass/agent/agentmetrics"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/probe/nvmlprobe"
	"github.com/gpupass/gpupass/internal/retry"
)

// Files in the state directory.
const (
	KeyFile       = "agent.key"   // PKCS#8 PEM, mode 0600: the node's identity
	PublicKeyFile = "agent.pub"   // PKIX PEM: what the broker and cosign verify with
	StateFile     = "agent.json"  // agent id given by the broker
	ReportFile    = "report.json" // last signed report, byte for byte
	SigFile       = "report.sig"  // its base64 signature
)

// Agent is one running node daemon.
type Agent struct {
	o      *Options
	log    *slog.Logger
	key    *ecdsa.PrivateKey
	pubPEM []byte
	suite  *suite.Suite
	// python builds the Python probe for a package list (a spec's).
	python  func(packages []string) probe.Probe
	profile *probe.Profile
	// tls is what the agent trusts for an https broker URL (--tls-ca,
	// read once in New): enrollment, heartbeats and the work API.
	tls *tls.Config

	mu      sync.Mutex
	agentID string
	// The heartbeat session key from the last enrollment (nil: sign each
	// beat). Kept in memory only: a restart enrolls again for a new one.
	sessKey   []byte
	sessEpoch uint64
	// creds prove the node on every work call (enrollment sets them,
	// every broker answer refreshes the echoed time).
	creds    *api.AgentCredentials
	last     *SignedReport
	lastFacs *probe.Facts
	// runs counts the runs in progress (RunLoop.Busy): periodic suite
	// runs wait while it is above zero.
	runs atomic.Int32
	// link keeps the warm link measurement process of an agent that runs
	// gang ranks itself (nil otherwise): linkworker.go.
	link *linkWorkers
	// runNow asks the main loop for an on-demand suite run.
	runNow chan chan runResult
	// metrics are served at GET /metrics on the query endpoint.
	metrics *agentmetrics.Metrics
}

// SignedReport is one conformance report as the node signed it.
type SignedReport struct {
	Report    *conformance.Report
	Bytes     []byte // canonical bytes, exactly as signed
	Signature string
	Uploaded  bool
	generated time.Time
	// python is the run's interpreter as a run report measured it (nil
	// for node reports), handed on to runtime-init's package check.
	python *executor.MeasuredPython
}

// reportMaxAge: a report older than this is measured again before upload,
// well within the broker's 15-minute limit.
const reportMaxAge = 5 * time.Minute

// MarshalJSON writes the report as the signed bytes themselves, so a
// client can verify the signature over exactly what it received (the
// "report" value), with no HTML escaping or re-encoding in between.
func (sr *SignedReport) MarshalJSON() ([]byte, error) {
	sig, err := json.Marshal(sr.Signature)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(`{"report":`)
	b.Write(sr.Bytes)
	b.WriteString(`,"signature":`)
	b.Write(sig)
	fmt.Fprintf(&b, `,"uploaded":%t}`, sr.Uploaded)
	return b.Bytes(), nil
}

type runResult struct {
	rep *SignedReport
	err error
}

type persisted struct {
	AgentID   string `json:"agent_id"`
	BrokerURL string `json:"broker_url"`
}

// New prepares an agent: it loads or creates the identity key (0600) in
// the state dir and sets up the probes. It does not touch the network.
func New(o *Options, log *slog.Logger) (*Agent, error) {
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir %s: %w", o.StateDir, err)
	}
	if ra, field := o.jobUser(); ra != nil && o.standsFor != nil && o.standsFor.JobDir() != "" {
		// A cluster run's work dir is in the shared dir, not here.
		if err := ra.CanReach(o.standsFor.JobDir()); err != nil {
			return nil, fielderr.New(field, ra.Spec, "%w", err)
		}
	} else if ra != nil {
		// Jobs running as another user reach their work dirs under
		// runs/ through the state dir: they may pass through it, not
		// list it. What it holds that is not public (the key, the
		// state file, the spools) is 0600 or 0700 on its own.
		if err := os.Chmod(o.StateDir, 0o711); err != nil {
			return nil, fmt.Errorf("opening state dir %s to jobs running as %s: %w", o.StateDir, ra.Spec, err)
		}
		if err := ra.CanReach(o.StateDir); err != nil {
			return nil, fielderr.New(field, ra.Spec, "%w", err)
		}
	}
	key, err := conformance.LoadOrCreateKey(filepath.Join(o.StateDir, KeyFile))
	if err != nil {
		return nil, err
	}
	pub, err := conformance.PublicKeyPEM(key)
	if err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(o.StateDir, PublicKeyFile), pub, 0o644); err != nil {
		return nil, err
	}
	tlsConf, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	a := &Agent{o: o, log: log, key: key, pubPEM: pub, tls: tlsConf, runNow: make(chan chan runResult),
		metrics: agentmetrics.New(agentmetrics.DefaultNVML())}
	a.creds = &api.AgentCredentials{Sign: func(p []byte) (string, error) { return conformance.Sign(key, p) }}
	if b, err := os.ReadFile(filepath.Join(o.StateDir, StateFile)); err == nil {
		var p persisted
		if json.Unmarshal(b, &p) == nil && p.BrokerURL == o.BrokerURL {
			a.agentID = p.AgentID
		}
	}
	storage := o.StoragePath
	if storage == "" {
		storage = o.StateDir
	}
	gpu := nvmlprobe.Default()
	var nvcc probe.Probe = probe.NVCC{Path: o.NVCC}
	// The node's own interpreter (--python), started isolated: the agent's
	// cwd or PYTHON* variables must not bring code into a root process.
	a.python = func(pk []string) probe.Probe { return probe.Python{Exe: o.Python, Packages: pk, Isolated: true} }
	if o.Simulate != "" {
		p, err := probe.LoadProfile(o.Simulate)
		if err != nil {
			return nil, err
		}
		// The seed is the identity key, so a node keeps its simulated GPU
		// UUIDs across restarts and two nodes never share them.
		p = p.WithSeed(string(pub))
		a.profile = p
		gpu = p.GPUProbe()
		if n := p.NVCCProbe(); n != nil {
			nvcc = n
		}
		if p.Runtime != nil {
			a.python = func(pk []string) probe.Probe { return p.PythonProbe(pk) }
		}
	}
	a.suite = suite.New(gpu, nvcc, a.python(nil), probe.Storage{Path: storage},
		probe.ReadThroughput{Path: storage, Bytes: int64(o.ReadProbeMB) << 20}, probe.FIPS{})
	if o.standsFor != nil {
		a.suite = o.standsFor.Suite(o)
	}
	return a, nil
}

// Facts runs the probes of the suite once and returns what they found:
// the `gpupass-agent facts` command, run on a cluster's node (a Slurm job
// step, a Kubernetes Job) for the agent that stands for it, which checks
// and signs them.
func (a *Agent) Facts(ctx context.Context) (*probe.Facts, error) {
	res, err := a.suite.Run(ctx, a.expectations())
	if err != nil {
		return nil, err
	}
	return &res.Facts, nil
}

// PublicKeyPEM returns the agent's PKIX PEM public key.
func (a *Agent) PublicKeyPEM() []byte { return a.pubPEM }

// expectations are what the node promises by its labels.
func (a *Agent) expectations() suite.Expectations {
	return suite.Expectations{StorageClass: a.o.StorageClass}
}

// RunOnce runs the suite and returns the signed report, without a broker.
func (a *Agent) RunOnce(ctx context.Context) (*SignedReport, error) {
	return a.measure(ctx)
}

func (a *Agent) measure(ctx context.Context) (*SignedReport, error) {
	res, err := a.suite.Run(ctx, a.expectations())
	if err != nil {
		return nil, err
	}
	if a.o.standsFor != nil {
		// First: where and how the node was measured is the cause when
		// the rest fail (a drained node is not measured at all), and the
		// broker keeps only the first few failed checks.
		first, last := a.o.standsFor.Checks(&res.Facts)
		res.Checks = append(append(first, res.Checks...), last...)
	}
	a.metrics.Conformance(res.Checks, res.Wall)
	a.mu.Lock()
	id := a.agentID
	a.lastFacs = &res.Facts
	a.mu.Unlock()
	// generated_at (milliseconds) must rise from report to report: the
	// broker refuses one that is not later than the last it took.
	now := time.Now().UTC().Truncate(time.Millisecond)
	a.mu.Lock()
	if a.last != nil && !now.After(a.last.generated) {
		now = a.last.generated.Add(time.Millisecond)
	}
	a.mu.Unlock()
	rep, err := res.Report(suite.ReportInput{AgentID: id, Node: a.o.node(), StorageClass: a.o.StorageClass, Now: now})
	if err != nil {
		return nil, err
	}
	b, err := rep.Marshal()
	if err != nil {
		return nil, err
	}
	sig, err := conformance.Sign(a.key, b)
	if err != nil {
		return nil, err
	}
	sr := &SignedReport{Report: rep, Bytes: b, Signature: sig, generated: now}
	a.log.Info("conformance suite ran", "passed", rep.Passed(), "wall_ms", rep.SuiteDurationMS, "reused", res.Reused, "simulated", rep.Simulated, "runtime_fingerprint", rep.RuntimeFingerprint)
	if id != "" {
		// Keep the last report next to the key: auditors and `cosign
		// verify-blob` read it from there.
		if err := fsutil.WriteFileAtomic(filepath.Join(a.o.StateDir, ReportFile), b, 0o644); err != nil {
			return nil, err
		}
		if err := fsutil.WriteFileAtomic(filepath.Join(a.o.StateDir, SigFile), []byte(sig+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	a.last = sr
	a.mu.Unlock()
	return sr, nil
}

// Run enrolls, reports and heartbeats until ctx ends, then shuts down
// gracefully (the query endpoint finishes in-flight requests).
func (a *Agent) Run(ctx context.Context) error {
	if a.profile == nil {
		a.log.Info("probing real hardware")
	} else {
		a.log.Warn("simulated hardware profile: reports say simulated", "profile", a.profile.Name)
	}
	switch {
	case a.o.NoWork:
	case a.o.runAs != nil:
		a.log.Info("jobs run as " + a.o.runAs.String())
	case a.o.runAsRange != nil:
		a.log.Info("jobs run as a uid of their own from " + a.o.runAsRange.Spec)
	default:
		a.log.Warn("jobs run as the agent's own user and can read its identity key (so sign reports it never measured); run the agent as root with --run-as USER", "uid", os.Geteuid())
	}
	a.o.warnInsecureHTTP(a.log)
	if a.o.Registry.PlainHTTP && !a.o.NoWork {
		a.log.Warn("wheel bundles are pulled over plain HTTP (--plain-http): for loopback test registries only")
	}
	ln, err := net.Listen("tcp", a.o.QueryAddr)
	if err != nil {
		return fmt.Errorf("query endpoint on %s: %w", a.o.QueryAddr, err)
	}
	a.log.Info("query endpoint listening", "addr", ln.Addr().String())
	qctx, stopQuery := context.WithCancel(context.Background())
	qdone := make(chan error, 1)
	go func() { qdone <- a.serveQuery(qctx, ln) }()
	defer func() {
		stopQuery()
		<-qdone
	}()
	if a.o.AddrFile != "" {
		if err := fsutil.WriteFileAtomic(a.o.AddrFile, []byte("http://"+ln.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
	}

	co := a.o.brokerOptions(a.tls)
	co.Timeout = 30 * time.Second
	co.OnFailover = func(from, to string, err error) {
		a.log.Warn("broker replica stopped answering; moving to the next", "from", from, "to", to, "err", err)
	}
	clients, err := client.Dial(a.o.BrokerURL, co)
	if err != nil {
		return err
	}
	return a.Serve(ctx, NewControlPlane(clients))
}

// Serve is the node's control loop against cp until ctx ends: it
// measures, enrolls, takes runs (unless --no-work), uploads reports and
// heartbeats, enrolling again when the broker lost the node or its
// session key.
func (a *Agent) Serve(ctx context.Context, cp ControlPlane) error {
	// The suite runs at start, before enrollment finishes, so a broker
	// that is down does not delay the node's own view of itself.
	if _, err := a.measure(ctx); err != nil {
		return err
	}
	enr, err := a.enroll(ctx, cp)
	if err != nil {
		return err
	}
	// Held from now: the first beat's hold time must cover the run loop's
	// start and the first upload, or the broker counts them as network
	// round trip (a node a second "away" scores below its peers).
	hb := &beat{echo: enr.BrokerTimeUnixNano, got: time.Now(), interval: seconds(enr.HeartbeatIntervalSeconds, 10*time.Second)}
	if !a.o.NoWork {
		waitWork, err := a.startRunLoop(ctx)
		if err != nil {
			return err
		}
		defer waitWork()
	}
	if _, err := a.measureAndUpload(ctx, cp); err != nil && ctx.Err() == nil {
		a.log.Warn("uploading report", "err", err)
	}
	beatT := time.NewTimer(0)
	defer beatT.Stop()
	suiteT := time.NewTicker(a.o.SuiteInterval)
	defer suiteT.Stop()
	for {
		select {
		case <-ctx.Done():
			a.log.Info("agent stopping")
			return nil
		case <-beatT.C:
			resp, err := a.heartbeat(ctx, cp, hb)
			hb, err = a.afterBeat(ctx, cp, hb, resp, err)
			if errors.Is(err, errBeatAgain) {
				beatT.Reset(10 * time.Millisecond)
				continue
			}
			beatT.Reset(hb.interval)
		case <-suiteT.C:
			if err := a.periodic(ctx, cp); err != nil && ctx.Err() == nil {
				a.log.Warn("periodic conformance run", "err", err)
			}
		case reply := <-a.runNow:
			sr, err := a.measureAndUpload(ctx, cp)
			reply <- runResult{sr, err}
		}
	}
}

// errBeatAgain: the beat was not counted (stale echo) and goes again at
// once, echoing the fresh broker time.
var errBeatAgain = errors.New("heartbeat not counted: stale echo")

// afterBeat acts on a heartbeat's outcome and returns the beat state for
// the next one: the broker's interval, a report it asked for, or a new
// enrollment when it lost the node (a wiped store) or refused the
// session key (rotated by another enrollment, or lost). errBeatAgain asks
// for a beat at once.
func (a *Agent) afterBeat(ctx context.Context, cp ControlPlane, hb *beat, resp *gpupassv1.HeartbeatResponse, err error) (*beat, error) {
	switch {
	case err == nil && resp.StaleEcho:
		a.log.Info("heartbeat not counted: stale echo; beating again")
		return hb, errBeatAgain
	case err == nil:
		hb.interval = seconds(resp.HeartbeatIntervalSeconds, hb.interval)
		if resp.ReportWanted {
			if err := a.upload(ctx, cp); err != nil && ctx.Err() == nil {
				a.log.Warn("uploading report", "err", err)
			}
		}
	case ctx.Err() != nil:
	case errors.Is(err, ErrUnknownAgent):
		a.log.Warn("broker does not know this agent; enrolling again", "err", err)
		if e, err := a.enroll(ctx, cp); err == nil {
			hb = hb.renewed(e)
			_ = a.upload(ctx, cp)
		}
	case errors.Is(err, ErrRefused) && a.hasSessionKey():
		// The next beat, one interval on, uses the new key.
		a.log.Warn("heartbeat refused; enrolling again for a new session key", "err", err)
		if e, err := a.enroll(ctx, cp); err == nil {
			hb = hb.renewed(e)
		} else if ctx.Err() == nil {
			a.log.Warn("enrolling again", "err", err)
		}
	default:
		a.log.Warn("heartbeat failed", "err", err)
	}
	return hb, nil
}

func (a *Agent) hasSessionKey() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessKey != nil
}

type beat struct {
	echo    int64
	got     time.Time
	counter uint64
	// interval is the broker's heartbeat interval.
	interval time.Duration
}

// renewed is the beat state after a new enrollment: the counter goes on.
func (hb *beat) renewed(e *gpupassv1.EnrollResponse) *beat {
	return &beat{echo: e.BrokerTimeUnixNano, got: time.Now(), counter: hb.counter, interval: hb.interval}
}

func (a *Agent) heartbeat(ctx context.Context, cp ControlPlane, hb *beat) (*gpupassv1.HeartbeatResponse, error) {
	a.mu.Lock()
	id, key, epoch := a.agentID, a.sessKey, a.sessEpoch
	a.mu.Unlock()
	// The counter is the clock in nanoseconds (or one more than the last):
	// it rises across restarts without being stored.
	hb.counter = max(hb.counter+1, uint64(time.Now().UnixNano()))
	req := &gpupassv1.HeartbeatRequest{AgentId: id, EchoBrokerTimeUnixNano: hb.echo, AgentHoldNanos: int64(time.Since(hb.got)), Counter: hb.counter}
	if key != nil {
		// The session key's HMAC costs the broker far less than
		// verifying a signature.
		req.SessionEpoch = epoch
		req.Mac = api.HeartbeatMAC(key, req)
	} else {
		sig, err := conformance.Sign(a.key, api.HeartbeatPayload(req))
		if err != nil {
			return nil, err
		}
		req.Signature = sig
	}
	resp, err := cp.Heartbeat(ctx, req, key)
	if err != nil {
		return nil, err
	}
	hb.echo, hb.got = resp.BrokerTimeUnixNano, time.Now()
	a.creds.SawBrokerTime(resp.BrokerTimeUnixNano)
	return resp, nil
}

// enroll retries with backoff while the broker is unreachable; a refusal
// (bad token, region out of scope, bad labels) or a broker certificate
// that is not trusted ends the agent at once, since retrying cannot fix it.
func (a *Agent) enroll(ctx context.Context, cp ControlPlane) (*gpupassv1.EnrollResponse, error) {
	fp, err := api.KeyFingerprint(&a.key.PublicKey)
	if err != nil {
		return nil, err
	}
	bo := retry.Backoff(500*time.Millisecond, 30*time.Second)
	for {
		// The proof (a fresh one per try: the broker wants a recent time)
		// gets the agent a heartbeat session key.
		req := &gpupassv1.EnrollRequest{PublicKeyPem: a.pubPEM, Labels: a.o.labels(), AgentVersion: buildinfo.Get().Version, ProofTimeUnixNano: time.Now().UnixNano()}
		if req.Proof, err = conformance.Sign(a.key, api.EnrollProofPayload(fp, req.ProofTimeUnixNano)); err != nil {
			return nil, err
		}
		resp, err := cp.Enroll(ctx, req)
		if err == nil {
			a.mu.Lock()
			a.agentID = resp.AgentId
			a.sessKey, a.sessEpoch = resp.SessionKey, resp.SessionEpoch
			if len(a.sessKey) == 0 {
				a.sessKey = nil // a broker without session keys: sign beats
			}
			a.creds.Set(resp.AgentId, a.sessKey, a.sessEpoch, resp.BrokerTimeUnixNano)
			a.mu.Unlock()
			b, _ := json.Marshal(persisted{AgentID: resp.AgentId, BrokerURL: a.o.BrokerURL})
			if err := fsutil.WriteFileAtomic(filepath.Join(a.o.StateDir, StateFile), b, 0o600); err != nil {
				return nil, err
			}
			a.log.Info("enrolled", "agent", resp.AgentId, "region", a.o.Region, "broker", a.o.BrokerURL)
			return resp, nil
		}
		if errors.Is(err, ErrRefused) {
			return nil, fmt.Errorf("enrolling with %s: %w", a.o.BrokerURL, err)
		}
		// An untrusted certificate is a configuration error, not an
		// outage: waiting will not make it trusted.
		if u, ok := api.UntrustedCert(err); ok {
			return nil, fmt.Errorf("enrolling with %s: %w", a.o.BrokerURL, u)
		}
		if p, ok := api.PlainHTTP(err); ok {
			return nil, fmt.Errorf("enrolling with %s: %w", a.o.BrokerURL, p)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("enrolling with %s: %w", a.o.BrokerURL, ctx.Err())
		}
		wait := bo.NextBackOff()
		a.log.Warn("broker unreachable; retrying", "broker", a.o.BrokerURL, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("enrolling with %s: %w", a.o.BrokerURL, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// busy marks a run in progress until the returned function is called.
func (a *Agent) busy() (done func()) {
	a.runs.Add(1)
	var once sync.Once
	return func() { once.Do(func() { a.runs.Add(-1) }) }
}

// periodic is the suite run on the agent's interval. It waits while a run
// is in progress: the run's own processes would hold the GPUs (failing
// the free-memory and foreign-process checks on a healthy node), the read
// probe would take the run's disk bandwidth and measure it contended, and
// the run was checked against its spec as it started. The next tick after
// the run measures again.
func (a *Agent) periodic(ctx context.Context, cp ControlPlane) error {
	if a.held("periodic conformance run") {
		return nil
	}
	_, err := a.measureAndUpload(ctx, cp)
	return err
}

// held reports, and logs, that a suite run for what must wait: a run is
// in progress (see periodic).
func (a *Agent) held(what string) bool {
	n := a.runs.Load()
	if n > 0 {
		a.log.Debug(what+" held: a run is in progress", "runs", n)
	}
	return n > 0
}

func (a *Agent) measureAndUpload(ctx context.Context, cp ControlPlane) (*SignedReport, error) {
	sr, err := a.measure(ctx)
	if err != nil {
		return nil, err
	}
	return sr, a.upload(ctx, cp)
}

func (a *Agent) upload(ctx context.Context, cp ControlPlane) error {
	a.mu.Lock()
	sr, id := a.last, a.agentID
	a.mu.Unlock()
	if sr == nil || sr.Report.AgentID != id || sr.Uploaded || time.Since(sr.generated) > reportMaxAge {
		// Measured before the agent id was known, already taken by the
		// broker, or too old: the broker refuses a report that is not
		// newer than the last it took, or older than 15 minutes.
		// Measuring again reuses what cannot have changed; not while a
		// run is in progress (see periodic): the broker asks again.
		if a.held("report") {
			return nil
		}
		var err error
		if sr, err = a.measure(ctx); err != nil {
			return err
		}
	}
	resp, err := cp.UploadReport(ctx, &gpupassv1.UploadReportRequest{AgentId: id, Report: sr.Bytes, Signature: sr.Signature})
	if err != nil {
		return err
	}
	a.mu.Lock()
	sr.Uploaded = true
	a.mu.Unlock()
	a.log.Info("report uploaded", "agent", id, "passed", resp.Passed, "runtime_fingerprint", resp.RuntimeFingerprint)
	return nil
}

func seconds(n int64, def time.Duration) time.Duration {
	if n <= 0 {
		return def
	}
	return time.Duration(n) * time.Second
}

var errNotRunning = errors.New("the agent's main loop is not running")

// tlsConfig trusts the system roots plus --tls-ca.
func (o *Options) tlsConfig() (*tls.Config, error) { return api.TrustCA(o.TLSCA) }

// warnInsecureHTTP says, at every start, that --insecure-http lets the
// token cross a network unencrypted (when the broker URL is one it
// applies to).
func (o *Options) warnInsecureHTTP(log *slog.Logger) {
	if u := client.PlainHTTPOffHost(o.BrokerURL); u != "" && o.InsecureHTTP {
		log.Warn("the broker token goes over plain HTTP, unencrypted, to a broker that may not be on this machine (--insecure-http): anyone on the network path can read it and act as this node; use an https:// broker URL", "broker", u)
	}
}

// brokerOptions are what every dial of the broker by this agent shares:
// token, trust, plain HTTP consent, protocol and user agent.
func (o *Options) brokerOptions(tlsConf *tls.Config) client.Options {
	return client.Options{Token: o.Token, GRPC: true, TLSConfig: tlsConf, InsecureHTTP: o.InsecureHTTP, UserAgent: buildinfo.UserAgent("gpupass-agent")}
}
