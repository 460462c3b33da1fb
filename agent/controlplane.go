package agent

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// ControlPlane is the broker as a node's control loop (Agent.Serve) sees
// it: enrollment, heartbeats and node reports. Every request names and
// proves its node (key proof, agent id, signed or MACed beat), so one
// ControlPlane serves every node an agent process enrolls: an executor
// that fronts several nodes (Slurm, Kubernetes) runs one Serve per node
// over the same ControlPlane. Errors are classified at the client edge
// (ErrRefused, ErrUnknownAgent, ErrUnsupported, ErrUnavailable), so the
// loop never looks at a transport's codes; a fake implements it in tests.
type ControlPlane interface {
	Enroll(ctx context.Context, req *gpupassv1.EnrollRequest) (*gpupassv1.EnrollResponse, error)
	// Heartbeat sends a beat; sessionKey is the key its MAC was made
	// with (nil for a signed beat), sent only to a broker replica that
	// asks for it (client.Clients.Heartbeat).
	Heartbeat(ctx context.Context, req *gpupassv1.HeartbeatRequest, sessionKey []byte) (*gpupassv1.HeartbeatResponse, error)
	UploadReport(ctx context.Context, req *gpupassv1.UploadReportRequest) (*gpupassv1.UploadReportResponse, error)
}

// What the broker's answer means for the caller; errors.Is tells them
// apart. An error of none of these kinds (an untrusted certificate, a
// local failure) is neither retried as an outage nor taken as a refusal.
var (
	// ErrRefused: the broker will not take the call as made (token,
	// scope, proof or arguments); repeating it cannot help.
	ErrRefused = errors.New("refused by the broker")
	// ErrUnknownAgent: the broker does not know the agent id (a wiped
	// store): enrolling again gets a new one.
	ErrUnknownAgent = errors.New("the broker does not know this agent")
	// ErrUnsupported: the broker does not serve this call (an older
	// broker).
	ErrUnsupported = errors.New("the broker does not serve this call")
	// ErrUnavailable: no answer, or none in time; worth retrying.
	ErrUnavailable = errors.New("the broker is unavailable")
)

// BrokerError is a broker call's error with its kind. Its text is the
// call's error as api.Describe words it; Unwrap reaches the original
// (api.UntrustedCert looks there).
type BrokerError struct {
	Kind error // one of the Err* kinds above, or nil
	Err  error
}

func (e *BrokerError) Error() string { return api.Describe(e.Err) }

// Unwrap gives errors.Is and errors.As both the kind and the original.
func (e *BrokerError) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// brokerErr classifies a ConnectRPC call's error; nil stays nil. It is
// the one place the agent maps codes to what they mean for it.
func brokerErr(err error) error {
	if err == nil {
		return nil
	}
	var kind error
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeInvalidArgument:
		kind = ErrRefused
	case connect.CodeNotFound:
		kind = ErrUnknownAgent
	case connect.CodeUnimplemented:
		kind = ErrUnsupported
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown:
		kind = ErrUnavailable
	}
	if _, ok := api.UntrustedCert(err); ok {
		// A configuration error, not an outage: waiting will not make
		// the certificate trusted.
		kind = nil
	}
	if _, ok := api.PlainHTTP(err); ok {
		kind = nil // nor will it make the network private
	}
	return &BrokerError{Kind: kind, Err: err}
}

// connectControlPlane is the ControlPlane over the broker's AgentService.
type connectControlPlane struct{ c *client.Clients }

// NewControlPlane is the ControlPlane of dialled broker clients.
func NewControlPlane(c *client.Clients) ControlPlane { return connectControlPlane{c} }

func (p connectControlPlane) Enroll(ctx context.Context, req *gpupassv1.EnrollRequest) (*gpupassv1.EnrollResponse, error) {
	resp, err := p.c.Agent.Enroll(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, brokerErr(err)
	}
	return resp.Msg, nil
}

func (p connectControlPlane) Heartbeat(ctx context.Context, req *gpupassv1.HeartbeatRequest, sessionKey []byte) (*gpupassv1.HeartbeatResponse, error) {
	resp, err := p.c.Heartbeat(ctx, req, sessionKey)
	if err != nil {
		return nil, brokerErr(err)
	}
	return resp, nil
}

func (p connectControlPlane) UploadReport(ctx context.Context, req *gpupassv1.UploadReportRequest) (*gpupassv1.UploadReportResponse, error) {
	resp, err := p.c.Agent.UploadReport(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, brokerErr(err)
	}
	return resp.Msg, nil
}
