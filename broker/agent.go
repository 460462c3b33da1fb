package broker

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

type agentService struct{ b *Broker }

// maxEchoAge bounds how old an echoed broker timestamp may be for an RTT:
// anything older is a stale or replayed echo, not a round trip.
const maxEchoAge = 10 * time.Minute

func (s *agentService) Enroll(ctx context.Context, req *connect.Request[gpupassv1.EnrollRequest]) (*connect.Response[gpupassv1.EnrollResponse], error) {
	b := s.b
	tok, _ := TokenFrom(ctx)
	m := req.Msg
	l := m.GetLabels()
	if l == nil || strings.TrimSpace(l.Region) == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("labels.region is required (e.g. us-west-2)"))
	}
	if err := api.CheckRegion(l.Region); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("labels.region: %w (the region the agent enrolls in)", err))
	}
	if err := checkRegion(tok, l.Region); err != nil {
		b.log.Warn("refused enrollment", "region", l.Region, "token", tok.ID, "err", err)
		return nil, err
	}
	if err := errors.Join(checkDeclared("labels.price_per_hour", l.PricePerHour, match.MaxPricePerHour),
		checkDeclared("labels.bandwidth_gbps", l.BandwidthGbps, maxBandwidthGbps)); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err := checkJobLabels(l); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	pub, err := conformance.ParsePublicKey(m.PublicKeyPem)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("public_key_pem: %w", err))
	}
	fp, err := api.KeyFingerprint(pub)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("public_key_pem: %w", err))
	}
	sk := b.sessionKeys()
	proven := false
	if m.Proof != "" {
		now := time.Now()
		if proven, err = checkEnrollProof(pub, fp, m, now); err != nil {
			b.log.Warn("refused enrollment", "region", l.Region, "token", tok.ID, "err", err)
			return nil, err
		}
		if !proven {
			b.log.Warn("enrollment proof time too far from the broker's clock: no session key, heartbeats must be signed (check the node's clock)",
				"region", l.Region, "token", tok.ID, "proof_time", time.Unix(0, m.ProofTimeUnixNano).UTC(), "window", api.EnrollProofWindow)
		}
	}
	idb := make([]byte, 8)
	_, _ = rand.Read(idb)
	labels := store.Labels{Provider: l.Provider, Region: l.Region, Zone: l.Zone, PricePerHour: l.PricePerHour,
		StorageClass: l.StorageClass, BandwidthGbps: l.BandwidthGbps, Hostname: l.Hostname,
		JobAddress: l.JobAddress, JobPortMin: int(l.JobPortMin), JobPortMax: int(l.JobPortMax)}
	var refused error
	a, created, err := b.store.EnrollAgent(ctx, store.Agent{
		ID: "agt-" + hex.EncodeToString(idb), PublicKeyPEM: m.PublicKeyPem, KeyFingerprint: fp,
		AgentVersion: m.AgentVersion, TokenID: tok.ID, EnrolledAt: time.Now().UTC(), Labels: labels,
	}, func(old store.Agent) error {
		refused = allowReenroll(tok, old, labels, proven)
		return refused
	})
	if refused != nil {
		b.log.Warn("refused enrollment", "region", l.Region, "token", tok.ID, "err", refused)
		return nil, refused
	}
	if err != nil {
		b.log.Error("enrolling agent", "err", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("storing enrollment failed"))
	}
	b.agentsMu.Lock()
	e, ok := b.agents[a.ID]
	if ok {
		e.agent, e.pub, e.loaded = a, pub, time.Now()
	} else {
		e = &agentEntry{agent: a, pub: pub, loaded: time.Now()}
		b.agents[a.ID] = e
	}
	b.agentsMu.Unlock()
	resp := &gpupassv1.EnrollResponse{
		AgentId:                  a.ID,
		HeartbeatIntervalSeconds: int64(b.cfg.HeartbeatInterval / time.Second),
		OfflineAfterSeconds:      int64(b.cfg.OfflineAfter / time.Second),
	}
	if proven && sk != nil {
		// Every proven enrollment rotates the key: an agent restart gets
		// a new one, and the old one stops working.
		if resp.SessionKey, resp.SessionEpoch, err = b.issueSessionKey(ctx, sk, e); err != nil {
			b.log.Error("issuing session key", "agent", a.ID, "err", err)
			return nil, connect.NewError(connect.CodeInternal, errors.New("storing the session key failed"))
		}
	}
	b.invalidate()
	b.log.Info("agent enrolled", "agent", a.ID, "new", created, "region", l.Region, "provider", l.Provider, "token", tok.ID, "session_epoch", resp.SessionEpoch)
	if b.admissionMode(l.Region) == AdmissionApprove {
		if state, _ := b.admissionOf(a.ID, l.Region, b.decided(ctx)); state != admitted {
			b.log.Warn("node takes no runs until an admin admits it", "agent", a.ID, "region", l.Region, "admission", state, "admit", approveHint(a.ID))
		}
	}
	resp.BrokerTimeUnixNano = b.brokerTime()
	return connect.NewResponse(resp), nil
}

// allowReenroll decides whether tok may enroll a key that is already
// enrolled as old, with labels. Public keys are public (audit zips hold
// them), so a key alone proves nothing: the token must cover the region
// the node is in now, not only the one asked for, and moving the node or
// changing what it declares needs a fresh proof that the caller holds the
// private key. Agents that send no proof (before session keys) may still
// enroll again as they are, as they do on every restart.
func allowReenroll(tok store.Token, old store.Agent, labels store.Labels, proven bool) error {
	if err := checkRegion(tok, old.Labels.Region); err != nil {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("this key is enrolled as agent %s in %s, outside the scope of token %s (%s): it cannot enroll it into %s; enroll with an agent token that covers %s, or give the node a new key (remove agent.key from its state dir)",
			old.ID, old.Labels.Region, tok.ID, strings.Join(tok.Regions, ","), labels.Region, old.Labels.Region))
	}
	if old.Labels != labels && !proven {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("agent %s is enrolled in %s with other labels: changing them (to region %s) needs a recent proof of key possession (upgrade gpupass-agent, or check the node's clock)",
			old.ID, old.Labels.Region, labels.Region))
	}
	return nil
}

// identity is e's enrolled agent record and key. Enroll replaces them,
// under agentsMu, when a node enrolls again while requests that already
// hold e are being served; read them only through here.
func (b *Broker) identity(e *agentEntry) (store.Agent, *ecdsa.PublicKey) {
	b.agentsMu.Lock()
	defer b.agentsMu.Unlock()
	return e.agent, e.pub
}

// agent returns an enrolled agent (cached: heartbeats are hot) after
// checking the caller's token covers its region.
func (b *Broker) agent(ctx context.Context, id string) (*agentEntry, error) {
	if id == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("agent_id is required"))
	}
	b.agentsMu.Lock()
	e, ok := b.agents[id]
	stale := ok && time.Since(e.loaded) > b.cfg.AgentTTL
	if stale {
		// Stamped before the read: concurrent calls for this agent,
		// and every call while the store is down, do not read again
		// until the TTL has passed once more.
		e.loaded = time.Now()
	}
	b.agentsMu.Unlock()
	if stale {
		b.reloadAgent(ctx, e, id)
	}
	if !ok {
		a, err := b.store.Agent(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown agent id %q: enroll first", id))
		}
		if err != nil {
			b.log.Error("reading agent", "agent", id, "err", err)
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("agent store unavailable"))
		}
		pub, err := conformance.ParsePublicKey(a.PublicKeyPEM)
		if err != nil {
			b.log.Error("stored agent key does not parse", "agent", id, "err", err)
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("the stored key of agent %s does not parse: enroll again", id))
		}
		_, rerr := b.store.LatestReport(ctx, id)
		e = &agentEntry{agent: a, pub: pub, hasReport: rerr == nil, loaded: time.Now()}
		b.agentsMu.Lock()
		b.agents[id] = e
		b.agentsMu.Unlock()
	}
	tok, _ := TokenFrom(ctx)
	ag, _ := b.identity(e)
	if err := checkRegion(tok, ag.Labels.Region); err != nil {
		return nil, err
	}
	return e, nil
}

// reloadAgent reads e's agent again from the store: another replica may
// have enrolled it again since (a new region or labels). On a store error
// the cached copy stays, and is tried again after AgentTTL.
func (b *Broker) reloadAgent(ctx context.Context, e *agentEntry, id string) {
	a, err := b.store.Agent(ctx, id)
	if err != nil {
		b.log.Warn("re-reading a cached agent; keeping the cached copy", "agent", id, "err", err)
		return
	}
	pub, err := conformance.ParsePublicKey(a.PublicKeyPEM)
	if err != nil {
		b.log.Error("stored agent key does not parse; keeping the cached copy", "agent", id, "err", err)
		return
	}
	b.agentsMu.Lock()
	e.agent, e.pub = a, pub
	b.agentsMu.Unlock()
}

func (s *agentService) Heartbeat(ctx context.Context, req *connect.Request[gpupassv1.HeartbeatRequest]) (*connect.Response[gpupassv1.HeartbeatResponse], error) {
	b := s.b
	m := req.Msg
	e, err := b.agent(ctx, m.AgentId)
	if err != nil {
		return nil, err
	}
	_, pub := b.identity(e)
	switch {
	case len(m.Mac) > 0:
		reveal, err := api.ParseSessionKeyHeader(req.Header().Get(api.SessionKeyHeader))
		if err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
		if err := b.checkMAC(ctx, e, m, reveal, req.Peer().Addr); err != nil {
			return nil, err
		}
	case m.Signature == "":
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("heartbeat of %s is not signed (no signature, no session key mac): upgrade gpupass-agent to the broker's version", m.AgentId))
	case !verifySig(pub, api.HeartbeatPayload(m), m.Signature):
		// Agents that predate session keys sign every beat.
		b.log.Warn("refused heartbeat: bad signature", "agent", m.AgentId, "peer", req.Peer().Addr)
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("heartbeat refused: its signature does not verify against the key enrolled for %s", m.AgentId))
	}
	now := time.Now()
	resp := &gpupassv1.HeartbeatResponse{
		HeartbeatIntervalSeconds: int64(b.cfg.HeartbeatInterval / time.Second),
		RttMs:                    -1,
	}
	// The echo is the broker's own clock: a recent one proves the beat was
	// made recently, whoever delivers it. An old one is not counted; the
	// agent's next beat echoes the time in this response.
	age := now.Sub(time.Unix(0, m.EchoBrokerTimeUnixNano))
	b.metrics.HeartbeatLag(age)
	if m.EchoBrokerTimeUnixNano <= 0 || age < 0 || age > b.echoWindow() {
		b.log.Info("heartbeat not counted: stale echo", "agent", m.AgentId, "echo_age", age.Round(time.Millisecond))
		b.agentsMu.Lock()
		resp.ReportWanted = !e.hasReport
		b.agentsMu.Unlock()
		resp.StaleEcho, resp.BrokerTimeUnixNano = true, b.brokerTime()
		return connect.NewResponse(resp), nil
	}
	rtt := -1.0
	if d := age - time.Duration(m.AgentHoldNanos); age <= maxEchoAge && d >= 0 && m.AgentHoldNanos >= 0 {
		rtt = float64(d) / float64(time.Millisecond)
	}
	b.beatsMu.Lock()
	if last := b.counter[m.AgentId]; m.Counter <= last {
		b.beatsMu.Unlock()
		b.log.Warn("refused heartbeat: replayed or out of order", "agent", m.AgentId, "counter", m.Counter, "last", last, "peer", req.Peer().Addr)
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("heartbeat refused: counter %d is not above %d, the last taken from %s (a replay, or a beat sent twice)", m.Counter, last, m.AgentId))
	}
	b.counter[m.AgentId] = m.Counter
	hb := store.Heartbeat{AgentID: m.AgentId, At: now, RTTMS: rtt}
	if prev, ok := b.seen.get(hb.AgentID); ok && rtt < 0 {
		hb.RTTMS = prev.RTTMS // keep the last measured RTT
	}
	b.seen.set(hb)
	b.dirty[hb.AgentID] = struct{}{}
	b.beatsMu.Unlock()
	b.agentsMu.Lock()
	resp.ReportWanted = !e.hasReport
	b.agentsMu.Unlock()
	// Tagged like every time given to agents, so that a beat's answer
	// keeps the agent's echo for this replica fresh; RTTs measured from
	// it are at most one tag span (65 µs) long.
	resp.RttMs, resp.BrokerTimeUnixNano = rtt, b.brokerTime()
	return connect.NewResponse(resp), nil
}

// echoWindow is how old an echoed broker time may be for a beat to count:
// a beat delivered later than this is stale or replayed.
func (b *Broker) echoWindow() time.Duration {
	return max(b.cfg.OfflineAfter, 2*b.cfg.HeartbeatInterval)
}

// verifySig checks a base64 ASN.1 ECDSA signature over SHA-256 of data.
func verifySig(pub *ecdsa.PublicKey, data []byte, sig string) bool {
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		return false
	}
	digest := sha256.Sum256(data)
	return ecdsa.VerifyASN1(pub, digest[:], raw)
}

func (s *agentService) UploadReport(ctx context.Context, req *connect.Request[gpupassv1.UploadReportRequest]) (*connect.Response[gpupassv1.UploadReportResponse], error) {
	b := s.b
	m := req.Msg
	e, err := b.agent(ctx, m.AgentId)
	if err != nil {
		return nil, err
	}
	ag, _ := b.identity(e)
	reject := func(code connect.Code, err error) error {
		b.log.Warn("rejected conformance report", "agent", m.AgentId, "peer", req.Peer().Addr, "reason", err.Error())
		return connect.NewError(code, err)
	}
	if err := conformance.Verify(ag.PublicKeyPEM, m.Report, m.Signature); err != nil {
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("report rejected: signature does not verify against the key enrolled for %s: %v", m.AgentId, err))
	}
	rep, err := conformance.Parse(m.Report)
	if err != nil {
		return nil, reject(connect.CodeInvalidArgument, fmt.Errorf("report rejected: %v", err))
	}
	if rep.AgentID != m.AgentId {
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("report rejected: it names agent %q but was uploaded as %s", rep.AgentID, m.AgentId))
	}
	if rep.Node.Region != ag.Labels.Region {
		return nil, reject(connect.CodePermissionDenied, fmt.Errorf("report rejected: it names region %q but %s enrolled in %s", rep.Node.Region, m.AgentId, ag.Labels.Region))
	}
	if err := errors.Join(checkDeclared("node.price_per_hour", rep.Node.PricePerHour, match.MaxPricePerHour),
		checkDeclared("node.bandwidth_gbps", rep.Node.BandwidthGbps, maxBandwidthGbps),
		checkDeclared("storage.free_gb", rep.Storage.FreeGB, maxStorageGB),
		checkDeclared("storage.read_mbps", rep.Storage.ReadMBps, maxReadMBps)); err != nil {
		return nil, reject(connect.CodeInvalidArgument, fmt.Errorf("report rejected: %v", err))
	}
	idx, err := indexReport(rep, ag.Labels)
	if err != nil {
		return nil, reject(connect.CodeInvalidArgument, fmt.Errorf("report rejected: %v", err))
	}
	if err := b.checkFresh(ctx, m.AgentId, idx.GeneratedAt); err != nil {
		return nil, reject(connect.CodeFailedPrecondition, err)
	}
	if err := b.store.SaveReport(ctx, store.Report{AgentID: m.AgentId, Bytes: m.Report, Signature: m.Signature, ReceivedAt: time.Now().UTC(), Index: idx}); err != nil {
		b.log.Error("saving report", "agent", m.AgentId, "err", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("storing report failed"))
	}
	b.agentsMu.Lock()
	e.hasReport = true
	b.agentsMu.Unlock()
	b.invalidate()
	b.log.Info("report accepted", "agent", m.AgentId, "passed", idx.Passed, "simulated", idx.Simulated, "runtime_fingerprint", idx.RuntimeFingerprint)
	return connect.NewResponse(&gpupassv1.UploadReportResponse{NodeId: m.AgentId, Passed: idx.Passed, RuntimeFingerprint: idx.RuntimeFingerprint}), nil
}

// Bounds of the numbers a node declares in its labels and its report
// (prices: match.MaxPricePerHour). Nothing real comes near them; past
// them a number is a mistake or an attack: two prices near MaxFloat64
// once overflowed a class mean and made health scores NaN.
const (
	maxBandwidthGbps = 1e6 // 1 Pb/s
	maxStorageGB     = 1e9 // 1 EB
	maxReadMBps      = 1e9
)

// checkDeclared refuses a declared number that is not finite or lies
// outside [0, max], naming field and the range.
// checkJobLabels checks where a node says its jobs can be reached: both
// or neither of an address and a port range, each what a rendezvous may
// use (a job's MASTER_ADDR is taken from it as it is).
func checkJobLabels(l *gpupassv1.NodeLabels) error {
	if l.JobAddress == "" && l.JobPortMin == 0 && l.JobPortMax == 0 {
		return nil
	}
	if err := rendezvous.CheckAddr(l.JobAddress); err != nil {
		return fmt.Errorf("labels.job_address: %w (where the node's jobs are reached)", err)
	}
	if err := rendezvous.CheckJobPorts(int(l.JobPortMin), int(l.JobPortMax)); err != nil {
		return fmt.Errorf("labels.job_port_min..job_port_max: %w (the node's job port range)", err)
	}
	return nil
}

func checkDeclared(field string, v, max float64) error {
	if v >= 0 && v <= max { // false for NaN
		return nil
	}
	return fmt.Errorf("%s is %v: want a number from 0 to %g", field, v, max)
}

// reportMaxSkew bounds how far a report's generated_at may be from the
// broker's clock: older is a replay (or a node clock that is off).
const reportMaxSkew = 15 * time.Minute

// checkFresh refuses a replayed report: one generated too far from now, or
// not after the last report accepted for the agent. The last report is
// read from the store, so every broker on it and a restarted one agree.
func (b *Broker) checkFresh(ctx context.Context, agentID string, gen time.Time) error {
	if gen.IsZero() {
		return errors.New("report rejected: it has no generated_at, so it could be a replay")
	}
	if skew := time.Since(gen); skew > reportMaxSkew || skew < -reportMaxSkew {
		return fmt.Errorf("report rejected: generated_at %s is %s from the broker's clock (limit %s): a replayed report, or the node's clock is off (check NTP)",
			gen.Format(time.RFC3339), skew.Round(time.Second), reportMaxSkew)
	}
	last, err := b.store.LatestReport(ctx, agentID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("report rejected: reading the last report: %w", err)
	}
	prev, err := conformance.Parse(last.Bytes)
	if err != nil {
		return nil // an unreadable stored report cannot be replayed either
	}
	if pt, err := time.Parse(time.RFC3339Nano, prev.GeneratedAt); err == nil && !gen.After(pt) {
		return fmt.Errorf("report rejected: generated_at %s is not after %s, that of the last report accepted for %s: a replayed or out-of-order report",
			gen.Format(time.RFC3339Nano), pt.Format(time.RFC3339Nano), agentID)
	}
	return nil
}

// indexReport extracts what the registry indexes from a verified report.
// Labels fill only what the report leaves empty: the signed report wins.
func indexReport(r *conformance.Report, l store.Labels) (store.NodeIndex, error) {
	ix := store.NodeIndex{
		Provider: r.Node.Provider, Region: r.Node.Region, Zone: r.Node.Zone, Hostname: r.Node.Hostname,
		GPUCount: len(r.GPUs), StorageClass: r.Storage.Class, StorageFreeGB: r.Storage.FreeGB, StorageReadMBps: r.Storage.ReadMBps,
		BandwidthGbps: r.Node.BandwidthGbps, PricePerHour: r.Node.PricePerHour,
		Runtime: r.Runtime, RuntimeFingerprint: r.RuntimeFingerprint, Simulated: r.Simulated, Profile: r.Profile, Passed: r.Passed(),
		FailedChecks: failedChecks(r), GresGPUs: gresGPUs(r),
	}
	// The index holds no package versions (store.NodeIndex.Runtime).
	ix.Runtime.Packages = nil
	if r.GeneratedAt != "" {
		t, err := time.Parse(time.RFC3339Nano, r.GeneratedAt)
		if err != nil {
			return ix, fmt.Errorf("generated_at %q: want RFC 3339 UTC", r.GeneratedAt)
		}
		ix.GeneratedAt = t.UTC()
	}
	for i, g := range r.GPUs {
		if i == 0 {
			ix.Accelerator, ix.GPUName, ix.GPUMemoryMiB = g.Class, g.Name, g.MemoryTotalMiB
			continue
		}
		if g.Class != ix.Accelerator {
			return ix, fmt.Errorf("gpus[%d].class %q differs from gpus[0].class %q: a node offers one accelerator class", i, g.Class, ix.Accelerator)
		}
		if g.MemoryTotalMiB < ix.GPUMemoryMiB {
			ix.GPUMemoryMiB = g.MemoryTotalMiB
		}
	}
	if ix.Provider == "" {
		ix.Provider = l.Provider
	}
	if ix.Zone == "" {
		ix.Zone = l.Zone
	}
	if ix.Hostname == "" {
		ix.Hostname = l.Hostname
	}
	if ix.StorageClass == "" {
		ix.StorageClass = l.StorageClass
	}
	if ix.BandwidthGbps == 0 {
		ix.BandwidthGbps = l.BandwidthGbps
	}
	if ix.PricePerHour == 0 {
		ix.PricePerHour = l.PricePerHour
	}
	return ix, nil
}
