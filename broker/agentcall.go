package broker

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
)

// Agent calls prove the node (api.AgentCredentials): agentCalls checks
// the proof of every AgentWorkService request before its body is
// decoded, and the handlers take the agent id only from the proof
// (callerAgent). So an agent token alone can no longer poll another
// node's work, report its runs, upload its records or keep it online.

type agentCallKey struct{}

// replayWindow refuses a call counter taken before. Calls of one agent
// run concurrently (a long poll, uploads, state updates), so counters
// may arrive out of order: every counter above floor is taken once, and
// the set of taken ones is bounded by time (the echo window makes older
// calls stale anyway) and by count.
type replayWindow struct {
	mu    sync.Mutex
	floor uint64
	taken map[uint64]struct{}
	high  uint64
}

const (
	// replaySpan is how far below the highest counter (nanoseconds of
	// the agent's clock) a late call is still taken.
	replaySpan = uint64(2 * time.Minute)
	// replayMax bounds the counters kept per agent.
	replayMax = 4096
)

func (w *replayWindow) take(c uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.taken == nil {
		w.taken = map[uint64]struct{}{}
	}
	if _, dup := w.taken[c]; dup || c <= w.floor {
		return false
	}
	w.taken[c] = struct{}{}
	if c > w.high {
		w.high = c
		if w.high > replaySpan {
			w.floor = max(w.floor, w.high-replaySpan)
		}
	}
	if len(w.taken) > replayMax || w.floor > 0 {
		for k := range w.taken {
			if k <= w.floor {
				delete(w.taken, k)
			}
		}
		for len(w.taken) > replayMax {
			// Raise the floor to the oldest counter kept.
			low := w.high
			for k := range w.taken {
				low = min(low, k)
			}
			w.floor = low
			delete(w.taken, low)
		}
	}
	return true
}

// agentCalls wraps the AgentWorkService handler: each request must carry
// a valid api.AgentCallHeader for an enrolled agent in the token's scope.
func (b *Broker) agentCalls(next http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.BrokerTimeHeader, strconv.FormatInt(b.brokerTime(), 10))
		ctx, body, err := b.proveAgentCall(w, r)
		if err != nil {
			_ = ew.Write(w, r, err)
			return
		}
		r = r.WithContext(ctx)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

func (b *Broker) proveAgentCall(w http.ResponseWriter, r *http.Request) (context.Context, []byte, error) {
	ctx := r.Context()
	proc := r.URL.Path
	refuse := func(code connect.Code, agent string, err error) (context.Context, []byte, error) {
		b.log.Warn("refused agent call", "procedure", proc, "agent", agent, "peer", r.RemoteAddr, "err", err)
		return nil, nil, connect.NewError(code, err)
	}
	// The token first: nothing of an unauthenticated request is read.
	// The guard (httpguard.go) has looked it up before the body; a
	// handler served without the guard looks it up here.
	tok, ok := TokenFrom(ctx)
	if !ok {
		var err error
		if tok, err = b.authenticate(ctx, r.Header.Get(api.AuthHeader)); err != nil {
			return nil, nil, err
		}
	}
	if tok.Role != store.RoleAgent && tok.Role != store.RoleAdmin {
		return refuse(connect.CodePermissionDenied, "", fmt.Errorf("token %s has role %s; %s needs role agent", tok.ID, tok.Role, proc))
	}
	hv := r.Header.Get(api.AgentCallHeader)
	if hv == "" {
		return refuse(connect.CodeUnauthenticated, "", fmt.Errorf("%s carries no %s header: every agent call must prove the node's identity (upgrade gpupass-agent to the broker's version)", proc, api.AgentCallHeader))
	}
	call, err := api.ParseAgentCall(hv)
	if err != nil {
		return refuse(connect.CodeUnauthenticated, "", err)
	}
	ctx = context.WithValue(ctx, tokenKey{}, tok)
	e, err := b.agent(ctx, call.AgentID)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, api.MaxRecordsBytes+64<<10))
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("reading the body of %s: %w", proc, err))
	}
	sum := sha256.Sum256(body)
	payload := api.AgentCallPayload(proc, call, sum[:])
	if call.MAC != nil {
		reveal, err := api.ParseSessionKeyHeader(r.Header.Get(api.SessionKeyHeader))
		if err != nil {
			return refuse(connect.CodeInvalidArgument, call.AgentID, err)
		}
		key, epoch, err := b.sessionKey(ctx, e, call.AgentID, call.Epoch, reveal)
		if api.SessionKeyWanted(err) {
			// A header as well as the error's metadata: over gRPC the
			// error writer sends metadata as trailers, and the agent's
			// transport decides on the answer's headers.
			w.Header().Set(api.SessionKeyWantedHeader, "1")
			return nil, nil, err
		}
		if err != nil {
			return nil, nil, err
		}
		if key == nil || call.Epoch != epoch {
			return refuse(connect.CodePermissionDenied, call.AgentID, fmt.Errorf("agent call refused: session key epoch %d is not the current one (%d) of %s: enroll again for a new key", call.Epoch, epoch, call.AgentID))
		}
		if !hmac.Equal(api.AgentCallMAC(key, payload), call.MAC) {
			return refuse(connect.CodePermissionDenied, call.AgentID, fmt.Errorf("agent call refused: its mac does not verify with the session key of %s", call.AgentID))
		}
	} else {
		_, pub := b.identity(e)
		if !verifySig(pub, payload, call.Sig) {
			return refuse(connect.CodePermissionDenied, call.AgentID, fmt.Errorf("agent call refused: its signature does not verify against the key enrolled for %s", call.AgentID))
		}
	}
	// Fresh: the echoed broker time is recent, so a call captured earlier
	// (or before a broker restart, which forgets counters) is stale.
	if call.Echo&api.EchoReplicaMask != b.echoTag {
		// The counters taken are known to the replica whose time the call
		// echoes: here it could be a replay (api.EchoReplicaMask).
		w.Header().Set(api.StaleEchoHeader, "1")
		return refuse(connect.CodeAborted, call.AgentID, errors.New("agent call refused: the broker time it echoes is another broker replica's (a replay, or an agent that moved between replicas: gpupass-agent makes the call again with the time of this answer)"))
	}
	if age := time.Since(time.Unix(0, call.Echo)); call.Echo <= 0 || age < 0 || age > b.echoWindow() {
		w.Header().Set(api.StaleEchoHeader, "1")
		return refuse(connect.CodeAborted, call.AgentID, fmt.Errorf("agent call refused: the broker time it echoes is %s old, more than %s (a replay, or an agent back from a partition: gpupass-agent makes the call again with the time of this answer)", age.Round(time.Second), b.echoWindow()))
	}
	if !e.calls.take(call.Counter) {
		return refuse(connect.CodeAborted, call.AgentID, fmt.Errorf("agent call refused: counter %d was taken before from %s (a replay)", call.Counter, call.AgentID))
	}
	return context.WithValue(ctx, agentCallKey{}, call.AgentID), body, nil
}

// callerAgent returns the agent that proved this call, after checking
// that the request names it (claimed) and that the token covers its
// region. Handlers of agent calls use it instead of b.agent.
func (b *Broker) callerAgent(ctx context.Context, claimed string) (*agentEntry, error) {
	proven, ok := ctx.Value(agentCallKey{}).(string)
	if !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("agent call without a proof of the node's identity"))
	}
	if claimed != proven {
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("the request names agent %q but the call was made by %s", claimed, proven))
	}
	return b.agent(ctx, proven)
}
