// Package api is the wire contract between broker, agents and clients: the
// .proto files under proto/, the generated protobuf and ConnectRPC code under
// gen/ (regenerate with `make generate`), and the wire's small rules (auth
// header, agent-call proofs, limits, error wording). It is the only package
// that broker and agent both import for the wire; internal/client dials the
// broker with it.
package api

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
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

// DefaultDryRunLimit is how many candidates, and how many excluded nodes,
// a dry-run lists when the request sets no limit (DryRunRequest.limit):
// more than a terminal or a page shows, a small fraction of a fleet.
const DefaultDryRunLimit = 100

// AuthHeader is the header that carries the bearer token.
const AuthHeader = "Authorization"

// Describe turns an RPC error into a sentence for users: the broker's own
// message with the code in words (unauthenticated -> "401 unauthenticated"),
// or, for a broker certificate that does not verify, what is wrong and how
// to trust it.
func Describe(err error) string {
	if u, ok := UntrustedCert(err); ok {
		return u.Error()
	}
	if p, ok := PlainHTTP(err); ok {
		return p.Error()
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
	if _, ok := PlainHTTP(err); ok {
		return false // refused here, before the dial: a broker may well answer
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// httpStatus is the HTTP status the Connect protocol gives code, as a
// broker sends it (connect-go's connectCodeToHTTP, which is unexported):
// refusals of what the client asked (failed_precondition, out_of_range)
// are 4xx, so a user does not read them as the broker's fault.
func httpStatus(c connect.Code) int {
	switch c {
	case connect.CodeCanceled:
		return 499
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError // unknown, internal, data_loss
}

// Type aliases so callers need not import the generated package for the
// common messages.
type (
	Node        = gpupassv1.Node
	HealthScore = gpupassv1.HealthScore
	Reason      = gpupassv1.Reason
)
