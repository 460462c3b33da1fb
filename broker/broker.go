// Package broker is the gpupass control plane: the certified-node registry
// (enrollment, heartbeats, verified conformance reports), matching and
// health scores, and auth by region- and role-scoped tokens. It serves the
// internal/api services with ConnectRPC (gRPC, gRPC-Web and HTTP/JSON on
// one port). Agents dial out to it; it never dials an agent.
//
// Limits: AgentService messages up to api.MaxAgentMessageBytes (4 MiB),
// NodeService messages up to api.MaxClientMessageBytes (1 MiB), request
// headers up to 64 KiB. Larger or malformed requests are refused.
//
// Liveness: heartbeats are kept in memory and written to the store in one
// batch every FlushInterval, so one broker sustains thousands of beats per
// second on SQLite; a node is offline when its last beat in the store is
// older than OfflineAfter, which every replica computes the same way.
//
// Replays: heartbeats are signed by the agent key with a rising counter
// and an echoed broker time (agent.go); a report must be newer than the
// last one accepted for its agent and within 15 minutes of the broker's
// clock. A replica that restarted, or has not yet taken a beat from an
// agent, knows no counter for it: it relies on the echo window (OfflineAfter,
// at least two heartbeat intervals), so a captured beat could count there
// once within that window, no longer. Agent calls (agentcall.go) are
// bound to the replica whose time they echo, so they cannot cross.
//
// Replicas on one PostgreSQL share once-only work (run supervision,
// offline reports) through a lease in the store (lease.go).
//
// Registry reads (list, dry-run, placement) use an in-memory snapshot
// prepared for matching (registry.go, match.Index), refreshed from the
// store in the background; see Config.SnapshotTTL.
package broker

import (
	"context"
	"crypto/ecdsa"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"

	"github.com/gpupass/gpupass/broker/brokermetrics"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/ui"
	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/workdir"
)

// Config configures a Broker. Zero durations take the defaults.
type Config struct {
	Store  store.Store
	Logger *slog.Logger
	// HeartbeatInterval is what agents are told to beat at (default 10 s).
	HeartbeatInterval time.Duration
	// OfflineAfter marks a node offline after this long without a beat
	// (default 3 heartbeat intervals).
	OfflineAfter time.Duration
	// FlushInterval is how often buffered heartbeats are written (default
	// 250 ms; keep it well below OfflineAfter).
	FlushInterval time.Duration
	// SnapshotTTL is how often the registry snapshot that serves list,
	// dry-run and placement calls is refreshed from the store (default
	// 500 ms). From 100 ms up a background loop refreshes it, so calls do
	// not wait for the store; a call refreshes it itself only when it is
	// older than twice the TTL. Writes through this broker drop it at
	// once; other replicas' writes show within about the TTL.
	SnapshotTTL time.Duration
	// StartTimeout ends a run that sits in matched or starting this long
	// without a word from its (heartbeating) node: an agent that took the
	// lease and restarted, or one that never polls (default 2 minutes).
	StartTimeout time.Duration
	// SessionKeyTTL bounds how long this broker trusts its cached copy
	// of an agent's heartbeat session key (session.go): a key rotated
	// through another replica stops working here within it (default
	// 10 s, as for tokens).
	SessionKeyTTL time.Duration
	// AgentTTL bounds how long this broker trusts its cached copy of an
	// enrolled agent (its region, labels and key): a re-enrollment through
	// another replica shows here within it (default 1 minute: each
	// reload is a store read, and agents beat every 10 s).
	AgentTTL time.Duration
	// Per-run quota (quota.go): records (by seq), bytes of log (event and
	// metric records) and records per second through this replica. Zero
	// takes the defaults (DefaultRunMax*); negative turns a limit off.
	RunMaxRecords          int64
	RunMaxLogBytes         int64
	RunMaxRecordsPerSecond int
	// MaxTimeLimit is the longest wall-clock limit a run may ask for
	// (train --time-limit or the spec's resources.time-limit); Submit
	// refuses longer ones (default and at most spec.MaxTimeLimit). A run
	// that asks for none has none.
	MaxTimeLimit time.Duration
	// Workdir bounds what a submitted work dir archive may unpack to;
	// Submit reads the archive under it before storing the run (zero
	// fields take workdir.Default).
	Workdir workdir.Limits
	// Metrics configures GET /metrics (metrics.go).
	Metrics MetricsConfig
	// Admission says how each region admits newly enrolled nodes
	// (admission.go; ParseAdmission): the first rule matching a region
	// decides; none (the default) admits every node.
	Admission []AdmissionRule
	// Dashboard bounds the web dashboard's sessions (dashboard.go).
	Dashboard DashboardConfig
	// LeaseTTL is how long the lease of once-only work (lease.go) lasts
	// without renewal: when the replica holding it dies, another takes
	// it within LeaseTTL plus LeaseTTL/3 (default DefaultLeaseTTL).
	LeaseTTL time.Duration
	// Webhooks tunes the deliveries of webhooks (webhooks.go).
	Webhooks WebhookConfig
}

// Broker is the control plane service.
type Broker struct {
	cfg   Config
	store store.Store
	log   *slog.Logger

	// ckptSlots bounds the GetCheckpoint calls assembling a checkpoint
	// at once: each holds up to twice api.MaxCheckpointBytes.
	ckptSlots chan struct{}

	tokens tokenCache

	agentsMu sync.Mutex
	agents   map[string]*agentEntry

	// seen holds the newest heartbeat this broker received per agent (it
	// overlays the store, so a beat counts before it is flushed and while
	// a cached snapshot is older than it); dirty lists those to flush.
	beatsMu sync.RWMutex
	seen    beatTable
	dirty   map[string]struct{}
	// counter is the highest heartbeat counter taken per agent: a beat
	// must rise above it (replays are refused).
	counter map[string]uint64

	// The registry snapshot (registry.go): snapMu guards snap and writes,
	// refreshMu makes one refresh at a time.
	snapMu    sync.Mutex
	snap      *snapshot
	writes    uint64
	refreshMu sync.Mutex

	offlineMu sync.Mutex
	online    map[string]bool // last seen state, to log transitions

	specs knownSpecs // specs by fingerprint, for ListNodes' spec filter (specs.go)

	runs   *runsState  // wake-ups for long polls and log followers (runs.go)
	quota  quotaState  // per-run accounting (quota.go)
	health storeHealth // whether the store takes writes (quota.go)

	mounts []mount

	metrics *brokermetrics.Metrics // Prometheus families (metrics.go)

	// started bounds the start timeout: agents could not report while
	// this broker was down.
	started time.Time

	// replicaID names this process among replicas sharing the store;
	// once is its hold on the lease of once-only work (lease.go).
	replicaID string
	// echoTag marks the broker times this replica gives agents, so that
	// it takes only agent calls made for it (agentcall.go).
	echoTag int64
	once    leaseState
	// hooks sends webhooks when run groups end (webhooks.go).
	hooks *hookState

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

type agentEntry struct {
	agent     store.Agent
	pub       *ecdsa.PublicKey // parsed once: every heartbeat is verified
	hasReport bool
	// loaded is when agent and pub were read from the store (or set by
	// an enrollment through this broker).
	loaded time.Time
	// The heartbeat session key (session.go) as this replica last knew
	// it: its verifier and epoch read from the store when sessLoaded is
	// older than SessionKeyTTL or a beat names a newer epoch, at most
	// once per sessionReloadEvery (tried); the key itself only when this
	// replica issued it or the agent showed it (nil until then).
	sessKey               []byte
	sessVerifier          []byte
	sessEpoch             uint64
	sessLoaded, sessTried time.Time
	// calls refuses replayed agent calls (agentcall.go).
	calls replayWindow
}

// New returns a broker over cfg.Store and starts its background work
// (heartbeat flushing, offline detection). Call Close to stop it.
func New(cfg Config) *Broker {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 10 * time.Second
	}
	if cfg.OfflineAfter <= 0 {
		cfg.OfflineAfter = 3 * cfg.HeartbeatInterval
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 250 * time.Millisecond
	}
	if cfg.SnapshotTTL <= 0 {
		cfg.SnapshotTTL = 500 * time.Millisecond
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	if cfg.AgentTTL <= 0 {
		cfg.AgentTTL = time.Minute
	}
	if cfg.SessionKeyTTL <= 0 {
		cfg.SessionKeyTTL = tokenTTL
	}
	if cfg.MaxTimeLimit <= 0 || cfg.MaxTimeLimit > spec.MaxTimeLimit {
		cfg.MaxTimeLimit = spec.MaxTimeLimit
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	cfg.RunMaxRecords = orDefault(cfg.RunMaxRecords, DefaultRunMaxRecords)
	cfg.RunMaxLogBytes = orDefault(cfg.RunMaxLogBytes, DefaultRunMaxLogBytes)
	cfg.RunMaxRecordsPerSecond = orDefault(cfg.RunMaxRecordsPerSecond, DefaultRunMaxRecordsPerSecond)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Broker{
		cfg: cfg, store: cfg.Store, log: cfg.Logger,
		tokens:  tokenCache{m: map[string]cachedToken{}},
		agents:  map[string]*agentEntry{},
		seen:    newBeatTable(),
		counter: map[string]uint64{},
		dirty:   map[string]struct{}{},
		online:  map[string]bool{},
		stop:    make(chan struct{}),
		runs:    newRunsState(),
		started: time.Now(),

		replicaID: newReplicaID(), echoTag: newEchoTag(),
	}
	b.ckptSlots = make(chan struct{}, maxCheckpointReads)
	b.metrics = b.newMetrics()
	// Replicas on one store pass their wake-ups to each other (signal.go).
	if sg, ok := b.store.(store.Signals); ok {
		if _, shared := b.leases(); shared {
			r := newRelay(sg)
			b.runs.relay = r
			b.metrics.SignalListening(false) // until its first listen
			b.wg.Add(2)
			go b.sendSignals(r)
			go b.listenSignals(r)
		}
	}
	b.wg.Add(4)
	if b.cfg.SnapshotTTL >= minBackgroundTTL {
		b.wg.Add(1)
		go b.every(b.cfg.SnapshotTTL, 30*time.Second, "refreshing the registry", b.refreshInBackground)
	}
	go b.every(b.cfg.FlushInterval, finalFlushTimeout, "writing heartbeats", b.flush)
	go b.every(max(b.cfg.OfflineAfter/3, 100*time.Millisecond), 10*time.Second, "checking liveness", b.checkLiveness)
	// Runs are re-placed and lost nodes noticed at least every second,
	// by one replica (lease.go).
	go b.every(max(min(b.cfg.OfflineAfter/3, time.Second), 50*time.Millisecond), 30*time.Second, "supervising runs", b.onceOnly(b.superviseRuns))
	b.startWebhooks()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.LeaseTTL/3)
		if err := b.renewLease(ctx); err != nil {
			b.log.Error("taking the lease of once-only work", "err", err)
		}
		cancel()
		b.every(b.cfg.LeaseTTL/3, b.cfg.LeaseTTL/3, "taking the lease of once-only work", b.renewLease)
	}()
	return b
}

type mount struct {
	path string
	h    http.Handler
}

// Mount adds a later service (runs, logs, metrics) to the port the broker
// serves; call it before Handler. Wrap its handlers with AuthInterceptor
// and declare who may call its procedures with AllowRoles.
func (b *Broker) Mount(path string, h http.Handler) { b.mounts = append(b.mounts, mount{path, h}) }

// AuthInterceptor authenticates calls and checks their role (AllowRoles);
// the caller's token is then available from TokenFrom.
func (b *Broker) AuthInterceptor() connect.Interceptor { return b.authInterceptor() }

// Store returns the broker's store (for services mounted beside it).
func (b *Broker) Store() store.Store { return b.store }

// Handler returns the HTTP handler serving every broker service.
func (b *Broker) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, m := range b.mounts {
		mux.Handle(m.path, m.h)
	}
	auth := connect.WithInterceptors(b.metrics.Interceptor(), b.authInterceptor())
	p, h := gpupassv1connect.NewAgentServiceHandler(&agentService{b}, auth, connect.WithReadMaxBytes(api.MaxAgentMessageBytes))
	mux.Handle(p, h)
	p, h = gpupassv1connect.NewNodeServiceHandler(&nodeService{b}, auth, connect.WithReadMaxBytes(api.MaxClientMessageBytes))
	mux.Handle(p, withAfterWrite(h)) // NodeService is unary only

	b.handleRuns(mux)
	// Reflection lets grpcurl and other gRPC tools call the broker without
	// the .proto files. It is served without a token: it reveals only the
	// schema, which is public (internal/api/proto), never data.
	reflector := grpcreflect.NewStaticReflector(gpupassv1connect.AgentServiceName, gpupassv1connect.NodeServiceName,
		gpupassv1connect.AgentWorkServiceName, gpupassv1connect.RunServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, connect.WithReadMaxBytes(api.MaxClientMessageBytes)))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, connect.WithReadMaxBytes(api.MaxClientMessageBytes)))
	mux.Handle(ui.Prefix, b.dashboard(mux))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if why := b.storeUnwritable(); why != "" {
			// Nodes stay online (liveness is in memory), but nothing
			// new can be stored: a load balancer should know.
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("store not writable: " + why + "\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", b.metricsHandler())
	return b.metrics.HTTP(mux)
}

// Close flushes buffered heartbeats and stops background work. The store
// stays open (the caller owns it).
func (b *Broker) Close(ctx context.Context) error {
	b.stopWaiting()
	b.wg.Wait()
	b.releaseLease(ctx)
	return b.flush(ctx)
}

// stopWaiting ends long polls and log follows (and background work), as
// a shutdown begins; heartbeats that still arrive are flushed by Close.
func (b *Broker) stopWaiting() { b.stopOnce.Do(func() { close(b.stop) }) }

// every runs fn each interval, with its own timeout, until the broker
// stops; a failure is logged as what went wrong and the loop goes on. All
// the broker's background loops go through it.
func (b *Broker) every(interval, timeout time.Duration, what string, fn func(context.Context) error) {
	defer b.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			if err := fn(ctx); err != nil {
				b.log.Error(what, "err", err)
			}
			cancel()
		}
	}
}

// flush writes buffered heartbeats. On failure they stay dirty, so a
// store hiccup loses no liveness.
func (b *Broker) flush(ctx context.Context) error {
	b.beatsMu.Lock()
	if len(b.dirty) == 0 {
		b.beatsMu.Unlock()
		return nil
	}
	batch := make([]store.Heartbeat, 0, len(b.dirty))
	for id := range b.dirty {
		hb, _ := b.seen.get(id)
		batch = append(batch, hb)
	}
	clear(b.dirty)
	b.beatsMu.Unlock()
	err := b.store.RecordHeartbeats(ctx, batch)
	news := b.noteStoreWrite(err)
	if err != nil {
		b.metrics.StoreError("heartbeats")
		b.beatsMu.Lock()
		for _, hb := range batch {
			b.dirty[hb.AgentID] = struct{}{}
		}
		b.beatsMu.Unlock()
		if !news && ctx.Err() == nil {
			return nil // said once (noteStoreWrite), tried again next tick
		}
		return err
	}
	return nil
}

// beat returns the newest heartbeat this broker received from an agent.
func (b *Broker) beat(id string) (store.Heartbeat, bool) {
	b.beatsMu.RLock()
	hb, ok := b.seen.get(id)
	b.beatsMu.RUnlock()
	return hb, ok
}

// checkLiveness logs nodes going offline and coming back; liveness itself
// is computed from last-seen at read time, so replicas agree.
func (b *Broker) checkLiveness(ctx context.Context) error {
	snap, err := b.snapshot(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	// While beats cannot be written, other replicas' beats do not reach
	// the store: only the beats this broker took prove anything, and a
	// node it has not seen is not called offline for it.
	unwritable := b.storeUnwritable() != ""
	// Every replica follows the transitions, so that the one that takes
	// the lease knows which nodes were online; only the holder says so.
	speak := b.leading()
	live := b.liveness(snap, nil)
	b.offlineMu.Lock()
	defer b.offlineMu.Unlock()
	for i, n := range snap.nodes {
		last := n.LastSeen
		if at := live[i].At; at != 0 && (last.IsZero() || at > last.UnixNano()) {
			last = time.Unix(0, at) // taken here, maybe not yet flushed
		}
		on := !last.IsZero() && now.Sub(last) <= b.cfg.OfflineAfter
		was, known := b.online[n.ID]
		if unwritable && !on {
			continue
		}
		switch {
		case !speak:
		case known && was && !on:
			b.log.Warn("node offline: missed heartbeats", "node", n.ID, "region", n.Labels.Region, "last_seen", last)
		case (!known || !was) && on:
			b.log.Info("node online", "node", n.ID, "region", n.Labels.Region)
		}
		b.online[n.ID] = on
	}
	return nil
}

// orDefault is v, or def when v is zero (negative values mean "off").
func orDefault[T int | int64](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}
