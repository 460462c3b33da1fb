// Package client is the one way to reach the broker: it parses the broker
// URL, builds the HTTP/2 client (TLS with the trusted CAs for https,
// cleartext HTTP/2 otherwise), and adds the bearer token and user agent to
// every call, unary and streaming, through one interceptor. Agents plug
// their per-call node proof (api.AgentCredentials) into the same dial.
// It holds the one rule for plain HTTP (plainhttp.go): a token goes over
// http:// only to a loopback address, unless Options.InsecureHTTP.
//
// It holds no command-line concerns: callers (the CLI's command layer,
// the agent, tests) pass what their flags said in Options.
package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
)

// DefaultTimeout bounds each Dial call when Options.Timeout is 0.
const DefaultTimeout = 30 * time.Second

// Options say how to reach the broker.
type Options struct {
	// Token is sent as a bearer token on every call (none when empty).
	Token string
	// GRPC selects the gRPC protocol instead of Connect (agents use it:
	// one HTTP/2 connection, binary).
	GRPC bool
	// TLSConfig is used for https URLs; nil means CAFile, or the system
	// roots when that is empty too.
	TLSConfig *tls.Config
	// CAFile is a PEM file of CAs to trust besides the system roots (for a
	// private CA or a self-signed broker); used when TLSConfig is nil.
	CAFile string
	// Timeout bounds each whole call of Dial's clients; 0 means
	// DefaultTimeout. DialRuns ignores it (see RunClients).
	Timeout time.Duration
	// UserAgent is sent on every call; empty keeps connect's own.
	UserAgent string
	// Agent, when set, proves the node's identity on every
	// AgentWorkService call (see api.AgentCredentials).
	Agent *api.AgentCredentials
	// NoGzip asks for uncompressed answers even from a remote broker
	// (an agent's work assignments carry archives that are compressed
	// already). On loopback no gzip is asked for anyway.
	NoGzip bool
	// OnFailover, when set, is told each time the client moves from one
	// broker replica to another (a URL list: failover.go), with the error
	// that made it move; agents log it. URLs come without credentials.
	OnFailover func(from, to string, err error)
	// InsecureHTTP lets the token go over plain http:// to an address
	// that is not loopback (--insecure-http); without it such a call is
	// refused before it connects (plainhttp.go).
	InsecureHTTP bool
}

// Clients are the broker's node and agent services, dialed with one token.
type Clients struct {
	Agent gpupassv1connect.AgentServiceClient
	Node  gpupassv1connect.NodeServiceClient
}

// RunClients are the run services, dialed with one token. Unlike Dial's
// clients they have no whole-call HTTP timeout: PollWork long-polls and
// GetLogs follows a run for as long as it runs, so callers bound calls
// with their context.
type RunClients struct {
	Run  gpupassv1connect.RunServiceClient
	Work gpupassv1connect.AgentWorkServiceClient
	// URL is the broker's, as dialled: errors name it.
	URL string
}

// Dial returns the node and agent service clients for the broker at
// baseURL (https:// with TLS; http:// for cleartext HTTP/2 on loopback, or
// anywhere with o.InsecureHTTP). Each call is bounded by o.Timeout. baseURL may list
// several replicas of one broker, comma-separated (failover.go).
func Dial(baseURL string, o Options) (*Clients, error) {
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	hc, base, opts, err := dial(baseURL, o)
	if err != nil {
		return nil, err
	}
	hc.Timeout = o.Timeout
	return &Clients{
		Agent: gpupassv1connect.NewAgentServiceClient(hc, base, opts...),
		Node:  gpupassv1connect.NewNodeServiceClient(hc, base, opts...),
	}, nil
}

// DialRuns returns the run service clients for the broker at baseURL
// (o.Timeout is ignored; see RunClients). Requests may be as large as a
// Submit with its work dir (api.MaxSubmitBytes).
func DialRuns(baseURL string, o Options) (*RunClients, error) {
	hc, base, opts, err := dial(baseURL, o)
	if err != nil {
		return nil, err
	}
	opts = append(opts, connect.WithSendMaxBytes(api.MaxSubmitBytes))
	return &RunClients{
		Run:  gpupassv1connect.NewRunServiceClient(hc, base, opts...),
		Work: gpupassv1connect.NewAgentWorkServiceClient(hc, base, opts...),
		URL:  baseURL,
	}, nil
}

// URLError is a broker URL that is not http://HOST:PORT or
// https://HOST:PORT. The command layer names the flag or input it came
// from.
type URLError struct{ URL string }

func (e *URLError) Error() string {
	return fmt.Sprintf("broker URL %q: want http://HOST:PORT or https://HOST:PORT", e.URL)
}

// dial is what Dial and DialRuns share: the URL check, the HTTP client and
// the connect options.
func dial(baseURL string, o Options) (*http.Client, string, []connect.ClientOption, error) {
	urls, err := ParseURLs(baseURL)
	if err != nil {
		return nil, "", nil, err
	}
	u := urls[0]
	guard := u.Scheme == "http" && (o.Token != "" || o.Agent != nil) && !o.InsecureHTTP
	if guard {
		if err := refuseLiteral(urls); err != nil {
			return nil, "", nil, err
		}
	}
	tlsConf := o.TLSConfig
	if tlsConf == nil && u.Scheme == "https" {
		if tlsConf, err = api.TrustCA(o.CAFile); err != nil {
			return nil, "", nil, err
		}
	}
	hc := HTTPClient(u.Scheme == "https", tlsConf)
	tr := hc.Transport.(*http.Transport)
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second} // http.DefaultTransport's
	if len(urls) > 1 {
		dialer.Timeout = FailoverDialTimeout
	}
	if guard {
		// A name is checked address by address as it is dialed (it may
		// resolve elsewhere later); a proxy would carry the token on.
		dialer.Control = loopbackOnly(baseURL)
		tr.Proxy = nil
	}
	tr.DialContext = dialer.DialContext
	if len(urls) > 1 {
		// The proof of an agent call (below) wraps the failover: a call
		// sent again to another replica is the same call, and the
		// replica's refusal of a foreign echo makes a fresh proof.
		hc.Transport = newFailover(urls, tr, o.OnFailover)
	}
	if o.Agent != nil {
		hc.Transport = o.Agent.Transport(hc.Transport)
	}
	opts := []connect.ClientOption{connect.WithInterceptors(headers{token: o.Token, userAgent: o.UserAgent})}
	if o.GRPC {
		opts = append(opts, connect.WithGRPC())
	}
	if o.NoGzip || allLoopback(urls) {
		// On loopback, gzip costs far more CPU than the bytes it saves
		// (a 10,000-node dry-run answer is megabytes): ask for none.
		opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	return hc, strings.TrimRight(u.String(), "/"), opts, nil
}

func allLoopback(urls []*url.URL) bool {
	for _, u := range urls {
		if !LoopbackHost(u.Hostname()) {
			return false
		}
	}
	return true
}

// HTTPClient returns an HTTP/2 client: with TLS for https, and cleartext
// HTTP/2 (h2c, prior knowledge) otherwise, which gRPC needs.
func HTTPClient(useTLS bool, cfg *tls.Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Without this the client asks for 16 KiB frames, and a dry-run answer
	// of a megabyte (10,000 nodes) arrives as ~70 frames, a read and a
	// write syscall each; 1 MiB frames (the server's own default) cut that.
	tr.HTTP2 = &http.HTTP2Config{MaxReadFrameSize: 1 << 20}
	if useTLS {
		tr.TLSClientConfig = cfg
		tr.ForceAttemptHTTP2 = true
		return &http.Client{Transport: tr}
	}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// headers is the one client interceptor: it adds the bearer token and the
// user agent to unary and streaming calls alike (a unary-only interceptor
// leaves GetLogs unauthenticated). The token is never logged.
type headers struct {
	token     string
	userAgent string
}

func (h headers) set(hdr http.Header) {
	if h.token != "" {
		hdr.Set(api.AuthHeader, "Bearer "+h.token)
	}
	if h.userAgent != "" {
		hdr.Set("User-Agent", h.userAgent)
	}
}

func (h headers) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		h.set(req.Header())
		return next(ctx, req)
	}
}

func (h headers) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, s connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, s)
		h.set(conn.RequestHeader())
		return conn
	}
}

func (h headers) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
