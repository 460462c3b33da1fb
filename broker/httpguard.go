package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokermetrics"
	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// HTTPLimits bound what a client can take of the broker before and while
// its request is read: memory for request bodies, time to send them, and
// connections (issue #16). Zero fields take the defaults.
type HTTPLimits struct {
	// MaxBodyMemory bounds the request body bytes held at once, all calls
	// together (default 256 MiB). Decoding a body takes about as much
	// again while the call runs, so leave about three times this in RSS
	// headroom.
	MaxBodyMemory int64
	// MaxBodyMemoryPerToken bounds one token's share of MaxBodyMemory, so
	// one caller cannot take it all (default half of it, and at least the
	// largest request body, a 64 MiB Submit). Calls without a token
	// (reflection, health) are bounded per client address instead.
	MaxBodyMemoryPerToken int64
	// BodyGrace and BodyMinRate bound how slowly a request body may
	// arrive: it must be complete within BodyGrace plus one second per
	// BodyMinRate bytes (defaults 10 s and 4 KiB/s), or the call is ended
	// and its connection closed. Only request bodies count: a long poll
	// or a log follow sends a small body, then waits for its response.
	BodyGrace   time.Duration
	BodyMinRate int64
	// MaxConns caps open connections (default 8192, and never more than
	// the open-file limit leaves, less a reserve for the store); over it,
	// new ones are closed as they are accepted instead of running the
	// broker out of file descriptors. The last eighth is kept for client
	// addresses that hold fewer than 4 connections, so a flood from a few
	// addresses does not lock out everyone else.
	MaxConns int
	// MaxConnsPerIP caps open connections from one client address
	// (default 1024: agents behind one NAT address share it).
	MaxConnsPerIP int
	// IdleTimeout closes keep-alive connections idle this long (default
	// 2 minutes).
	IdleTimeout time.Duration
}

const (
	defaultMaxBodyMemory = 256 << 20
	defaultBodyGrace     = 10 * time.Second
	defaultBodyMinRate   = 4 << 10
	defaultMaxConns      = 8192
	defaultMaxConnsPerIP = 1024
	defaultIdleTimeout   = 2 * time.Minute
	// fdReserve is kept out of MaxConns for the store, logs and the
	// listener itself.
	fdReserve = 256
	// reservedConnsFree: addresses holding fewer connections than this
	// may use the last eighth of MaxConns.
	reservedConnsFree = 4
	// openBodyLimit bounds the body of a call that needs no token
	// (reflection requests, health checks, unknown paths): all are tiny.
	openBodyLimit = 64 << 10
	// budgetWait is how long a call waits for body memory before it is
	// refused: long enough to ride out a burst, short enough that a
	// client is told rather than left hanging.
	budgetWait = 5 * time.Second
)

// withDefaults fills zero fields and checks the rest; nofile is the
// process's open-file limit (0: unknown).
// Fields of withDefaults' errors (*fielderr.Error).
const (
	FieldMaxBodyMemory         = "body memory"
	FieldMaxBodyMemoryPerToken = "body memory per token"
)

func (l HTTPLimits) withDefaults(nofile uint64, log *slog.Logger) (HTTPLimits, error) {
	if l.MaxBodyMemory <= 0 {
		l.MaxBodyMemory = defaultMaxBodyMemory
	}
	if l.MaxBodyMemoryPerToken <= 0 {
		l.MaxBodyMemoryPerToken = max(l.MaxBodyMemory/2, maxRequestBody)
	}
	if l.MaxBodyMemoryPerToken < maxRequestBody {
		return l, fielderr.New(FieldMaxBodyMemoryPerToken, fmt.Sprint(l.MaxBodyMemoryPerToken), "is below the largest request body (%d bytes, a Submit): raise it", maxRequestBody)
	}
	if l.MaxBodyMemory < l.MaxBodyMemoryPerToken {
		return l, fielderr.New(FieldMaxBodyMemory, fmt.Sprint(l.MaxBodyMemory), "is below the {body memory per token} (%d): raise it", l.MaxBodyMemoryPerToken)
	}
	if l.BodyGrace <= 0 {
		l.BodyGrace = defaultBodyGrace
	}
	if l.BodyMinRate <= 0 {
		l.BodyMinRate = defaultBodyMinRate
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = defaultIdleTimeout
	}
	if l.MaxConnsPerIP <= 0 {
		l.MaxConnsPerIP = defaultMaxConnsPerIP
	}
	if l.MaxConns <= 0 {
		l.MaxConns = defaultMaxConns
	}
	if nofile > 0 {
		// Past the open-file limit, accept fails with EMFILE and net/http
		// backs off accepting for everyone; below it, the limiter refuses
		// just the connections over the cap.
		room := int(min(nofile, 1<<30)) - fdReserve
		if room < 16 {
			return l, fmt.Errorf("open-file limit %d leaves no room for connections: raise it (ulimit -n, LimitNOFILE=)", nofile)
		}
		if l.MaxConns > room {
			log.Warn("lowering --max-conns to what the open-file limit allows; raise the limit (ulimit -n, LimitNOFILE=) to serve more",
				"max_conns", l.MaxConns, "nofile", nofile, "now", room)
			l.MaxConns = room
		}
	}
	l.MaxConnsPerIP = min(l.MaxConnsPerIP, l.MaxConns)
	return l, nil
}

// openFileLimit is the soft RLIMIT_NOFILE. The Go runtime has already
// raised it to the hard limit at start (os package, Go 1.19+).
func openFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}

// maxRequestBody is the largest request body any procedure takes.
const maxRequestBody = api.MaxSubmitBytes + api.MaxSubmitBytes/256 + 4<<10

// bodyLimit is the most a request body to proc may hold: its service's
// message limit (the WithReadMaxBytes it is mounted with) plus room for
// framing and for gzip, which grows incompressible data a little.
func bodyLimit(proc string) int64 {
	svc, _, _ := strings.Cut(strings.TrimPrefix(proc, "/"), "/")
	var m int64
	switch svc {
	case gpupassv1connect.AgentServiceName:
		m = api.MaxAgentMessageBytes
	case gpupassv1connect.AgentWorkServiceName:
		m = api.MaxRecordsBytes
	case gpupassv1connect.RunServiceName:
		m = api.MaxSubmitBytes
	default: // NodeService, and services mounted later
		m = api.MaxClientMessageBytes
	}
	return m + m/256 + 4<<10
}

// guard stands in front of every handler. It authenticates a call and
// checks its role from the headers alone, so a caller without a valid
// token is refused before one byte of its body is read; it takes the
// memory for the body from a shared budget as the body arrives, and
// ends bodies that arrive too slowly.
type guard struct {
	b      *Broker
	next   http.Handler
	lim    HTTPLimits
	budget *bodyBudget
	errw   *connect.ErrorWriter
}

func newGuard(b *Broker, next http.Handler, lim HTTPLimits) *guard {
	return &guard{b: b, next: next, lim: lim, errw: connect.NewErrorWriter(),
		budget: newBodyBudget(lim.MaxBodyMemory, lim.MaxBodyMemoryPerToken)}
}

func (g *guard) refuse(w http.ResponseWriter, r *http.Request, err error) {
	// The client may still be sending: tell it now and close the
	// connection rather than read the rest. net/http would discard up to
	// 256 KiB of it first, at whatever pace the client sends; the past
	// read deadline makes that end at once.
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	g.b.metrics.Refused(brokermetrics.GuardReason(err))
	_ = g.errw.Write(w, r, err)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	proc := r.URL.Path
	limit := int64(openBodyLimit)
	key := "addr " + hostOf(r.RemoteAddr)
	ctx := r.Context()
	if _, known := roles[proc]; known {
		t, err := g.b.authenticate(ctx, r.Header.Get(api.AuthHeader))
		if err == nil {
			err = checkRole(t, proc)
		}
		if err != nil {
			g.b.log.Info("refused call", "procedure", proc, "peer", r.RemoteAddr, "err", err)
			g.refuse(w, r, err)
			return
		}
		ctx = context.WithValue(ctx, tokenKey{}, t)
		limit, key = bodyLimit(proc), "token "+t.ID
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		g.next.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	if r.ContentLength > limit {
		g.refuse(w, r, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("request body of %d bytes is over the %d this call takes", r.ContentLength, limit)))
		return
	}
	// What to hold from the budget before reading: the whole body when
	// its length is known; a compressed body can inflate up to the limit
	// while it is decoded, so it holds that.
	first := min(int64(64<<10), limit)
	if r.ContentLength > 0 {
		first = r.ContentLength
	}
	if compressed(r.Header) {
		first = limit
	}
	if err := g.budget.acquire(ctx, key, first, budgetWait); err != nil {
		g.refuse(w, r, err)
		return
	}
	body := &guardedBody{g: g, rc: http.NewResponseController(w), src: http.MaxBytesReader(w, r.Body, limit),
		ctx: ctx, key: key, held: first, limit: limit, start: time.Now()}
	defer body.release()
	body.setDeadline()
	r2 := r.WithContext(ctx)
	r2.Body = body
	g.next.ServeHTTP(w, r2)
}

// compressed reports whether a request's messages may be compressed
// (Connect unary, Connect streaming, gRPC and gRPC-Web headers).
func compressed(h http.Header) bool {
	for _, k := range []string{"Content-Encoding", "Connect-Content-Encoding", "Grpc-Encoding"} {
		if v := h.Get(k); v != "" && v != "identity" {
			return true
		}
	}
	return false
}

// guardedBody reads a request body within the body budget and the body
// deadline. At EOF the call keeps only what it read (the decoded message
// is about that size) and the deadline is lifted: the call may now wait
// as long as it likes for its response (PollWork, GetLogs). Only the
// handler's goroutine reads it; release runs after the handler returns.
type guardedBody struct {
	g     *guard
	rc    *http.ResponseController
	src   io.ReadCloser
	ctx   context.Context //nolint:containedctx // the request's, for budget waits
	key   string
	held  int64 // taken from the budget
	read  int64
	limit int64
	start time.Time
	// waited is time spent waiting for budget: it does not count against
	// the client's rate.
	waited  time.Duration
	lastSet time.Time
	done    bool
}

func (gb *guardedBody) deadline() time.Time {
	rate := time.Duration(gb.read) * time.Second / time.Duration(gb.g.lim.BodyMinRate)
	return gb.start.Add(gb.g.lim.BodyGrace + gb.waited + rate)
}

// setDeadline moves the read deadline as the body arrives; at most once a
// second, which is its resolution anyway.
func (gb *guardedBody) setDeadline() {
	d := gb.deadline()
	if !gb.lastSet.IsZero() && d.Sub(gb.lastSet) < time.Second {
		return
	}
	gb.lastSet = d
	_ = gb.rc.SetReadDeadline(d)
}

func (gb *guardedBody) Read(p []byte) (int, error) {
	if gb.done {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if need := gb.read + int64(len(p)); need > gb.held && gb.held < gb.limit {
		// Take more in steps of a quarter of what is held, so a large
		// body of unknown length asks the budget a few dozen times.
		more := min(max(need-gb.held, gb.held/4, 256<<10), gb.limit-gb.held)
		t0 := time.Now()
		err := gb.g.budget.acquire(gb.ctx, gb.key, more, budgetWait)
		gb.waited += time.Since(t0)
		if err != nil {
			return 0, err
		}
		gb.held += more
		gb.setDeadline()
	}
	if room := gb.held - gb.read; int64(len(p)) > room && room > 0 {
		p = p[:room]
	}
	n, err := gb.src.Read(p)
	gb.read += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		gb.done = true
		_ = gb.rc.SetReadDeadline(time.Time{})
		if keep := gb.read; keep < gb.held {
			gb.g.budget.release(gb.key, gb.held-keep)
			gb.held = keep
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf(
			"request body arrived too slowly: %d bytes in %s (the broker waits %s plus 1 s per %d bytes)",
			gb.read, time.Since(gb.start).Round(time.Second), gb.g.lim.BodyGrace, gb.g.lim.BodyMinRate))
	case err == nil:
		gb.setDeadline()
	}
	return n, err
}

func (gb *guardedBody) Close() error { return gb.src.Close() }

// release gives back what the call held, when its handler returns.
func (gb *guardedBody) release() {
	gb.g.budget.release(gb.key, gb.held)
	gb.held = 0
	gb.done = true
}

// bodyBudget is a byte budget with a cap per key (a token, or a client
// address). Waiters are woken whenever bytes come back.
type bodyBudget struct {
	mu           sync.Mutex
	total, share int64
	used         int64
	byKey        map[string]int64
	freed        chan struct{}
}

func newBodyBudget(total, share int64) *bodyBudget {
	return &bodyBudget{total: total, share: share, byKey: map[string]int64{}, freed: make(chan struct{})}
}

func (bb *bodyBudget) acquire(ctx context.Context, key string, n int64, wait time.Duration) error {
	var timer *time.Timer
	for {
		bb.mu.Lock()
		if bb.used+n <= bb.total && bb.byKey[key]+n <= bb.share {
			bb.used += n
			bb.byKey[key] += n
			bb.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		freed, used, mine := bb.freed, bb.used, bb.byKey[key]
		bb.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-freed:
		case <-timer.C:
			limit, flag := bb.total, "--max-body-memory"
			if mine+n > bb.share {
				limit, flag = bb.share, "--max-body-memory-per-token"
			}
			return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
				"the broker holds %d MiB of request bodies (%d MiB of them this caller's) and has no room for %d KiB more within %s %d MiB: retry in a few seconds, or send fewer large requests at once",
				used>>20, mine>>20, n>>10, flag, limit>>20))
		case <-ctx.Done():
			timer.Stop()
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

func (bb *bodyBudget) release(key string, n int64) {
	if n <= 0 {
		return
	}
	bb.mu.Lock()
	bb.used -= n
	if bb.byKey[key] -= n; bb.byKey[key] <= 0 {
		delete(bb.byKey, key)
	}
	close(bb.freed)
	bb.freed = make(chan struct{})
	bb.mu.Unlock()
}

// hostOf is the address part of a host:port.
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// connLimiter caps open connections, in all and per client address. A
// connection over a cap is closed as soon as it is accepted: the kernel
// queue keeps draining, and file descriptors stay for the clients the
// broker does serve.
type connLimiter struct {
	net.Listener
	log          *slog.Logger
	onRefuse     func() // counts each refusal (the broker's metrics)
	max, perIP   int
	reserveAbove int // above this many, only addresses with few connections get in

	mu      sync.Mutex
	total   int
	byIP    map[string]int
	refused atomic.Int64
	logged  time.Time
}

func newConnLimiter(ln net.Listener, lim HTTPLimits, log *slog.Logger, onRefuse func()) *connLimiter {
	return &connLimiter{Listener: ln, log: log, onRefuse: onRefuse, max: lim.MaxConns, perIP: lim.MaxConnsPerIP,
		reserveAbove: lim.MaxConns - lim.MaxConns/8, byIP: map[string]int{}}
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := hostOf(c.RemoteAddr().String())
		if l.admit(ip) {
			return &limitedConn{Conn: c, l: l, ip: ip}, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			// A reset frees the socket at once, with no TIME_WAIT here.
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		l.noteRefused(ip)
	}
}

func (l *connLimiter) admit(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.byIP[ip]
	if l.total >= l.max || n >= l.perIP || (l.total >= l.reserveAbove && n >= reservedConnsFree) {
		return false
	}
	l.total++
	l.byIP[ip] = n + 1
	return true
}

func (l *connLimiter) done(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

// noteRefused logs refusals at most every 10 s: a flood must not also
// flood the log.
func (l *connLimiter) noteRefused(ip string) {
	n := l.refused.Add(1)
	if l.onRefuse != nil {
		l.onRefuse()
	}
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.logged) < 10*time.Second {
		l.mu.Unlock()
		return
	}
	l.logged = now
	total, fromIP := l.total, l.byIP[ip]
	l.mu.Unlock()
	l.log.Warn("refusing connections over the limit (--max-conns, --max-conns-per-ip)",
		"refused_so_far", n, "open", total, "last_from", ip, "open_from_it", fromIP)
}

type limitedConn struct {
	net.Conn
	l    *connLimiter
	ip   string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.done(c.ip) })
	return err
}
