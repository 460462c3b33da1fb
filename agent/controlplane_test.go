package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// fakeControlPlane is a broker that enrolls every node as agt-1 and
// answers heartbeats from a script.
type fakeControlPlane struct {
	mu        sync.Mutex
	enrollErr error
	beats     []error // answers to the next heartbeats; nil: counted
	enrolls   int
	heartbeat int
	uploads   int
	sessKey   []byte
}

func (f *fakeControlPlane) Enroll(_ context.Context, _ *gpupassv1.EnrollRequest) (*gpupassv1.EnrollResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enrolls++
	if f.enrollErr != nil {
		return nil, f.enrollErr
	}
	return &gpupassv1.EnrollResponse{AgentId: "agt-1", SessionKey: f.sessKey, SessionEpoch: 1, BrokerTimeUnixNano: time.Now().UnixNano(), HeartbeatIntervalSeconds: 1}, nil
}

func (f *fakeControlPlane) Heartbeat(_ context.Context, _ *gpupassv1.HeartbeatRequest, _ []byte) (*gpupassv1.HeartbeatResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heartbeat++
	if len(f.beats) > 0 {
		err := f.beats[0]
		f.beats = f.beats[1:]
		if err != nil {
			return nil, err
		}
	}
	return &gpupassv1.HeartbeatResponse{BrokerTimeUnixNano: time.Now().UnixNano(), HeartbeatIntervalSeconds: 1}, nil
}

func (f *fakeControlPlane) UploadReport(_ context.Context, req *gpupassv1.UploadReportRequest) (*gpupassv1.UploadReportResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uploads++
	return &gpupassv1.UploadReportResponse{Passed: true}, nil
}

func (f *fakeControlPlane) counts() (enrolls, beats, uploads int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enrolls, f.heartbeat, f.uploads
}

func connectErr(c connect.Code) error {
	return brokerErr(connect.NewError(c, errors.New("said the broker")))
}

// TestBrokerErrKinds: the client edge maps each ConnectRPC code to the
// kind the loops decide on, and words the error as api.Describe does.
func TestBrokerErrKinds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code connect.Code
		want error
	}{
		{connect.CodeUnauthenticated, ErrRefused},
		{connect.CodePermissionDenied, ErrRefused},
		{connect.CodeInvalidArgument, ErrRefused},
		{connect.CodeNotFound, ErrUnknownAgent},
		{connect.CodeUnimplemented, ErrUnsupported},
		{connect.CodeUnavailable, ErrUnavailable},
		{connect.CodeDeadlineExceeded, ErrUnavailable},
		{connect.CodeUnknown, ErrUnavailable},
		{connect.CodeInternal, nil},
	}
	kinds := []error{ErrRefused, ErrUnknownAgent, ErrUnsupported, ErrUnavailable}
	for _, tt := range tests {
		raw := connect.NewError(tt.code, errors.New("said the broker"))
		err := brokerErr(raw)
		for _, k := range kinds {
			if errors.Is(err, k) != (k == tt.want) {
				t.Errorf("%s: errors.Is(%v) = %t, want kind %v", tt.code, k, !(k == tt.want), tt.want)
			}
		}
		if err.Error() != api.Describe(raw) {
			t.Errorf("%s: text %q, want %q", tt.code, err.Error(), api.Describe(raw))
		}
		var ce *connect.Error
		if !errors.As(err, &ce) {
			t.Errorf("%s: the original connect error is not reachable", tt.code)
		}
	}
	if brokerErr(nil) != nil {
		t.Error("brokerErr(nil) is not nil")
	}
}

// TestAfterBeat: what the control loop does after each kind of
// heartbeat answer, against a fake broker.
func TestAfterBeat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		sessionKey   bool
		resp         *gpupassv1.HeartbeatResponse
		err          error
		wantAgain    bool
		wantEnroll   int
		wantUpload   int
		wantInterval time.Duration
	}{
		{"counted", true, &gpupassv1.HeartbeatResponse{HeartbeatIntervalSeconds: 7}, nil, false, 0, 0, 7 * time.Second},
		{"report wanted", true, &gpupassv1.HeartbeatResponse{ReportWanted: true}, nil, false, 0, 1, 3 * time.Second},
		{"stale echo", true, &gpupassv1.HeartbeatResponse{StaleEcho: true}, nil, true, 0, 0, 3 * time.Second},
		{"unknown agent", false, nil, connectErr(connect.CodeNotFound), false, 1, 1, 3 * time.Second},
		{"session key refused", true, nil, connectErr(connect.CodePermissionDenied), false, 1, 0, 3 * time.Second},
		{"refused without session key", false, nil, connectErr(connect.CodePermissionDenied), false, 0, 0, 3 * time.Second},
		{"broker away", true, nil, connectErr(connect.CodeUnavailable), false, 0, 0, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := New(simOptions(t, "h100-sxm5-8x"), quiet())
			if err != nil {
				t.Fatal(err)
			}
			cp := &fakeControlPlane{sessKey: []byte("k")}
			if _, err := a.enroll(context.Background(), cp); err != nil {
				t.Fatal(err)
			}
			if !tt.sessionKey {
				a.mu.Lock()
				a.sessKey = nil
				a.mu.Unlock()
			}
			cp.enrolls = 0
			hb := &beat{counter: 41, interval: 3 * time.Second}
			next, err := a.afterBeat(context.Background(), cp, hb, tt.resp, tt.err)
			if errors.Is(err, errBeatAgain) != tt.wantAgain {
				t.Errorf("beat again %v, want %t", err, tt.wantAgain)
			}
			enrolls, _, uploads := cp.counts()
			if enrolls != tt.wantEnroll || uploads != tt.wantUpload {
				t.Errorf("enrolled %d times, uploaded %d, want %d and %d", enrolls, uploads, tt.wantEnroll, tt.wantUpload)
			}
			if next.interval != tt.wantInterval || next.counter != 41 {
				t.Errorf("next beat: interval %s counter %d, want %s and 41", next.interval, next.counter, tt.wantInterval)
			}
		})
	}
}

// noWorkAgent is a simulated agent that takes no runs: Serve is its
// control loop alone.
func noWorkAgent(t *testing.T) *Agent {
	t.Helper()
	o := simOptions(t, "h100-sxm5-8x")
	o.NoWork = true
	a, err := New(o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestServeEnrollRefused: a refused enrollment ends the loop at once (no
// retry can fix a bad token), with the broker's words.
func TestServeEnrollRefused(t *testing.T) {
	t.Parallel()
	a := noWorkAgent(t)
	cp := &fakeControlPlane{enrollErr: connectErr(connect.CodeUnauthenticated)}
	err := a.Serve(context.Background(), cp)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("Serve = %v, want a refusal", err)
	}
	if enrolls, _, _ := cp.counts(); enrolls != 1 {
		t.Errorf("enrolled %d times, want 1", enrolls)
	}
}

// TestServeEnrollsAgainWhenLost: a broker that lost the node (NotFound on
// a heartbeat) gets a new enrollment and a report, and the loop beats on.
func TestServeEnrollsAgainWhenLost(t *testing.T) {
	t.Parallel()
	a := noWorkAgent(t)
	cp := &fakeControlPlane{beats: []error{connectErr(connect.CodeNotFound)}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, cp) }()
	// A bound for a broken loop, not a timing assertion.
	giveUp := time.After(2 * time.Minute)
	for {
		enrolls, beats, _ := cp.counts()
		if enrolls == 2 && beats >= 2 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Serve ended: %v", err)
		case <-giveUp:
			cancel()
			t.Fatalf("no second enrollment: %d enrollments, %d beats", enrolls, beats)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve = %v after cancel, want nil", err)
	}
	if _, _, uploads := cp.counts(); uploads < 2 {
		t.Errorf("uploaded %d reports, want one after each enrollment", uploads)
	}
}
