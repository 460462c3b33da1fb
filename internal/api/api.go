// Package api is the wire contract between broker, agents and clients: the
// .proto files under proto/, the generated protobuf and ConnectRPC code under
// gen/ (regenerate with `make generate`), and small helpers to dial the
// broker. It is the only package that broker and agent both import for the
// wire; internal/cli reaches the broker only through it.
package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
)

// Request size limits the broker enforces, per message. They are part of
// the contract (see broker.proto): clients should not send more.
const (
	// MaxAgentMessageBytes bounds AgentService requests (a signed report).
	MaxAgentMessageBytes = 4 << 20
	// MaxClientMessageBytes bounds NodeService requests (a spec).
	MaxClientMessageBytes = 1 << 20
)

// DefaultMinHealthScore is the dry-run threshold when none is given.
const DefaultMinHealthScore = 85.0

// AuthHeader is the header that carries the bearer token.
const AuthHeader = "Authorization"

// Clients are the broker's services, dialed with one token.
type Clients struct {
	Agent gpupassv1connect.AgentServiceClient
	Node  gpupassv1connect.NodeServiceClient
}

// DialOptions tune Dial.
type DialOptions struct {
	// Token is sent as a bearer token on every call.
	Token string
	// GRPC selects the gRPC protocol instead of Connect (agents use it: one
	// HTTP/2 connection, binary).
	GRPC bool
	// TLSConfig is used for https URLs; nil means system roots.
	TLSConfig *tls.Config
	// Timeout bounds each call; 0 means 30 s.
	Timeout time.Duration
	// Agent, when set, proves the node's identity on every
	// AgentWorkService call (see AgentCredentials).
	Agent *AgentCredentials
}

// Dial returns clients for the broker at baseURL (http:// for cleartext
// HTTP/2 on loopback or a private network, https:// with TLS).
func Dial(baseURL string, o DialOptions) (*Clients, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("broker URL %q: want http://HOST:PORT or https://HOST:PORT", baseURL)
	}
	base := strings.TrimRight(baseURL, "/")
	hc := HTTPClient(u.Scheme == "https", o.TLSConfig)
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	hc.Timeout = o.Timeout
	opts := []connect.ClientOption{connect.WithInterceptors(bearer(o.Token))}
	if o.GRPC {
		opts = append(opts, connect.WithGRPC())
	}
	if isLoopback(u.Hostname()) {
		// On loopback, gzip costs far more CPU than the bytes it saves
		// (a 10,000-node dry-run answer is megabytes): ask for none.
		opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	return &Clients{
		Agent: gpupassv1connect.NewAgentServiceClient(hc, base, opts...),
		Node:  gpupassv1connect.NewNodeServiceClient(hc, base, opts...),
	}, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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

// bearer adds the token to every request. The token is never logged.
func bearer(token string) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if token != "" {
				req.Header().Set(AuthHeader, "Bearer "+token)
			}
			return next(ctx, req)
		}
	})
}

// Describe turns an RPC error into a sentence for users: the broker's own
// message with the code in words (unauthenticated -> "401 unauthenticated"),
// or, for a broker certificate that does not verify, what is wrong and how
// to trust it.
func Describe(err error) string {
	if u, ok := UntrustedCert(err); ok {
		return u.Error()
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err.Error()
	}
	if NoAnswer(err) {
		// connect words a failed dial as "unavailable", but no HTTP answer
		// came back, so there is no status to show.
		return "no answer: " + ce.Message()
	}
	return fmt.Sprintf("%s (%d %s)", ce.Message(), httpStatus(ce.Code()), ce.Code())
}

// NoAnswer reports whether err means nothing answers at the broker's
// address: the connection could not be made (refused, no route, unknown
// host), so no broker (or another server) sent any HTTP status.
func NoAnswer(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

func httpStatus(c connect.Code) int {
	switch c {
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Type aliases so callers need not import the generated package for the
// common messages.
type (
	Node        = gpupassv1.Node
	HealthScore = gpupassv1.HealthScore
	Reason      = gpupassv1.Reason
)
