package api

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Agent calls. A bearer token says only "some agent of these regions"; it
// does not say which node is calling, and every node of a fleet may hold
// the same agent token. So every AgentWorkService call also proves the
// node's identity, the way heartbeats do: the agent authenticates the
// call's exact bytes (procedure, agent id, a rising counter, the broker
// time it last saw, and the SHA-256 of the request body) with its
// enrollment session key (HMAC-SHA256), or, without a session key, with
// its identity key (ECDSA). The broker checks that before it decodes the
// body, refuses a counter it has taken and an echoed time older than its
// window, and hands the handlers only the proven agent id.
const (
	// AgentCallHeader carries the proof: "v1;agent=ID;epoch=N;ctr=N;echo=N;mac=B64"
	// with a session key, or "…;sig=B64" (an ASN.1 ECDSA signature) without.
	AgentCallHeader = "Gpupass-Agent-Call"
	// BrokerTimeHeader is the broker's clock (Unix ns) on every answer
	// to an agent call, refusals included: the agent echoes the newest it
	// has seen.
	BrokerTimeHeader = "Gpupass-Broker-Time"
	// StaleEchoHeader marks a refusal for an echoed time older than the
	// broker's window (an agent back from a partition): the answer's
	// BrokerTimeHeader is fresh, and the agent makes the call again once.
	StaleEchoHeader = "Gpupass-Stale-Echo"
	// agentWorkPrefix is the path prefix of the calls that need a proof.
	agentWorkPrefix = "/gpupass.v1.AgentWorkService/"
	// EchoReplicaMask selects the low bits of a broker time that name the
	// broker replica that gave it (65 µs of the clock: heartbeat RTTs are
	// measured from these times; 65,536 tags make two replicas with one
	// tag, which would leave them unbound, unlikely). A
	// replica takes only agent calls that echo its own time, since the
	// counters it has taken are known to it alone: a call replayed to
	// another replica is refused there as a stale echo (and a real agent
	// moving to that replica makes the call again with its time).
	EchoReplicaMask = 1<<16 - 1
	// maxEchoReplicas bounds the replicas whose times an agent keeps.
	maxEchoReplicas = 16
)

// IsAgentCall reports whether an HTTP path is an AgentWorkService call.
func IsAgentCall(path string) bool { return strings.HasPrefix(path, agentWorkPrefix) }

// AgentCall is a parsed AgentCallHeader.
type AgentCall struct {
	AgentID string
	Epoch   uint64 // session key epoch; 0 with a signature
	Counter uint64
	Echo    int64 // broker time echoed, Unix ns
	MAC     []byte
	Sig     string // base64 ASN.1 ECDSA signature, when no MAC
}

// AgentCallPayload is what a call's MAC or signature covers.
func AgentCallPayload(procedure string, c AgentCall, bodySHA256 []byte) []byte {
	return fmt.Appendf(nil, "gpupass-agent-call/v1\n%s\n%s\n%d\n%d\n%d\n%x", procedure, c.AgentID, c.Epoch, c.Counter, c.Echo, bodySHA256)
}

// AgentCallMAC is the HMAC-SHA256 of payload under a session key.
func AgentCallMAC(key, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(payload)
	return m.Sum(nil)
}

// String formats c as the header value.
func (c AgentCall) String() string {
	s := fmt.Sprintf("v1;agent=%s;epoch=%d;ctr=%d;echo=%d", c.AgentID, c.Epoch, c.Counter, c.Echo)
	if c.MAC != nil {
		return s + ";mac=" + base64.RawURLEncoding.EncodeToString(c.MAC)
	}
	return s + ";sig=" + c.Sig
}

// maxAgentCallHeader bounds the header: an id, four numbers, a signature.
const maxAgentCallHeader = 512

// ParseAgentCall parses an AgentCallHeader value.
func ParseAgentCall(v string) (AgentCall, error) {
	var c AgentCall
	if len(v) > maxAgentCallHeader {
		return c, fmt.Errorf("%s header is %d bytes, more than %d", AgentCallHeader, len(v), maxAgentCallHeader)
	}
	parts := strings.Split(v, ";")
	if parts[0] != "v1" {
		return c, fmt.Errorf("%s header: version %q is not v1 (upgrade gpupass-agent to the broker's version)", AgentCallHeader, parts[0])
	}
	seen := map[string]bool{}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok || seen[k] {
			return c, fmt.Errorf("%s header: field %q is malformed or repeated", AgentCallHeader, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "agent":
			c.AgentID = val
		case "epoch":
			c.Epoch, err = strconv.ParseUint(val, 10, 64)
		case "ctr":
			c.Counter, err = strconv.ParseUint(val, 10, 64)
		case "echo":
			c.Echo, err = strconv.ParseInt(val, 10, 64)
		case "mac":
			c.MAC, err = base64.RawURLEncoding.DecodeString(val)
		case "sig":
			c.Sig = val
		default:
			return c, fmt.Errorf("%s header: unknown field %q", AgentCallHeader, k)
		}
		if err != nil {
			return c, fmt.Errorf("%s header: field %s: %w", AgentCallHeader, k, err)
		}
	}
	switch {
	case c.AgentID == "" || !seen["ctr"] || !seen["echo"]:
		return c, fmt.Errorf("%s header: agent, ctr and echo are required", AgentCallHeader)
	case (c.MAC == nil) == (c.Sig == ""):
		return c, fmt.Errorf("%s header: exactly one of mac and sig is required", AgentCallHeader)
	}
	return c, nil
}

// AgentCredentials are what an agent proves its calls with. The agent
// sets them at each enrollment and feeds them every broker time it sees;
// Transport adds the proof to each AgentWorkService request. Safe for
// concurrent use.
type AgentCredentials struct {
	// Sign signs a payload with the node's identity key (conformance.Sign);
	// used while the agent has no session key.
	Sign func(payload []byte) (string, error)

	mu      sync.Mutex
	agentID string
	key     []byte
	epoch   uint64
	counter uint64
	// echo is the newest broker time seen per replica (EchoReplicaMask);
	// a call echoes that of the replica the last agent call was answered
	// by (callTag, once there is one), since it most likely goes there
	// again (heartbeats may be on another replica).
	echo    map[int64]int64
	callTag int64
	byCall  bool
}

// Set records a new enrollment: the agent id, its session key and epoch
// (nil, 0 when the broker gave none) and the broker's time.
func (c *AgentCredentials) Set(agentID string, key []byte, epoch uint64, brokerTime int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.agentID, c.key, c.epoch = agentID, key, epoch
	c.saw(brokerTime)
}

// SawBrokerTime records a broker time from any answer (the newest of
// each replica wins).
func (c *AgentCredentials) SawBrokerTime(t int64) {
	c.mu.Lock()
	c.saw(t)
	c.mu.Unlock()
}

func (c *AgentCredentials) saw(t int64) {
	if t <= 0 {
		return
	}
	if c.echo == nil {
		c.echo = map[int64]int64{}
	}
	tag := t & EchoReplicaMask
	if _, ok := c.echo[tag]; !ok && len(c.echo) >= maxEchoReplicas {
		// A broker that does not tag its times looks like many
		// replicas: forget the oldest, never the one calls go to.
		old, found := int64(0), false
		for k, v := range c.echo {
			if (!c.byCall || k != c.callTag) && (!found || v < c.echo[old]) {
				old, found = k, true
			}
		}
		delete(c.echo, old)
	}
	c.echo[tag] = max(c.echo[tag], t)
}

// answered records the broker time of an agent call's answer: the next
// call echoes that replica's time.
func (c *AgentCredentials) answered(t int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.saw(t)
	if t > 0 {
		c.callTag, c.byCall = t&EchoReplicaMask, true
	}
}

// echoNow is the broker time the next call echoes (mu held).
func (c *AgentCredentials) echoNow() int64 {
	if c.byCall {
		return c.echo[c.callTag]
	}
	var newest int64
	for _, v := range c.echo {
		newest = max(newest, v)
	}
	return newest
}

// AgentID is the id of the last enrollment ("" before one).
func (c *AgentCredentials) AgentID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.agentID
}

// sessionKey is the current session key (nil: none).
func (c *AgentCredentials) sessionKey() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.key
}

// prove makes the header for one call with body hash sum.
func (c *AgentCredentials) prove(procedure string, sum []byte) (string, error) {
	c.mu.Lock()
	// The counter is the clock in nanoseconds (or one more than the
	// last): it rises across agent restarts without being stored.
	c.counter = max(c.counter+1, uint64(time.Now().UnixNano()))
	call := AgentCall{AgentID: c.agentID, Epoch: c.epoch, Counter: c.counter, Echo: c.echoNow()}
	key := c.key
	c.mu.Unlock()
	if call.AgentID == "" {
		return "", errors.New("agent call before enrollment: no agent id to prove")
	}
	if key != nil {
		call.MAC = AgentCallMAC(key, AgentCallPayload(procedure, call, sum))
		return call.String(), nil
	}
	if c.Sign == nil {
		return "", errors.New("agent call without a session key or a signing key")
	}
	call.Epoch = 0
	sig, err := c.Sign(AgentCallPayload(procedure, call, sum))
	if err != nil {
		return "", fmt.Errorf("signing an agent call: %w", err)
	}
	call.Sig = sig
	return call.String(), nil
}

// Transport wraps next so that every AgentWorkService request carries
// the proof of c's identity, and every answer's broker time is kept.
func (c *AgentCredentials) Transport(next http.RoundTripper) http.RoundTripper {
	return agentTransport{c: c, next: next}
}

type agentTransport struct {
	c    *AgentCredentials
	next http.RoundTripper
}

func (t agentTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !IsAgentCall(req.URL.Path) {
		return t.next.RoundTrip(req)
	}
	// Unary calls only: the body is one message, bounded by the
	// client's send limit, and must be hashed before it is sent.
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(io.LimitReader(req.Body, MaxRecordsBytes+64<<10))
		_ = req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("reading an agent call's body to authenticate it: %w", err)
		}
		body = b
	}
	sum := sha256.Sum256(body)
	// At most one retry for each reason: a stale echo, and a replica
	// that asks for the session key (SessionKeyWantedHeader).
	var staleTried, reveal bool
	for {
		h, err := t.c.prove(req.URL.Path, sum[:])
		if err != nil {
			return nil, err
		}
		r := req.Clone(req.Context())
		r.Header.Set(AgentCallHeader, h)
		if reveal {
			if k := t.c.sessionKey(); k != nil {
				r.Header.Set(SessionKeyHeader, EncodeSessionKey(k))
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		r.ContentLength = int64(len(body))
		resp, err := t.next.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		if v, perr := strconv.ParseInt(resp.Header.Get(BrokerTimeHeader), 10, 64); perr == nil {
			t.c.answered(v)
		}
		switch {
		case resp.Header.Get(SessionKeyWantedHeader) != "" && !reveal && t.c.sessionKey() != nil:
			// This replica holds only the key's verifier: the same
			// call again, with the key.
			reveal = true
		case resp.Header.Get(StaleEchoHeader) != "" && !staleTried:
			// Refused for an old echo only: the answer brought a fresh
			// broker time, so the same call with a new proof goes
			// through.
			staleTried = true
		default:
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}
}
