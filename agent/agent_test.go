package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
)

func simOptions(t *testing.T, profile string) *Options {
	t.Helper()
	o := &Options{
		StateDir: t.TempDir(), Region: "us-west-2", Provider: "sim", StorageClass: "standard",
		Simulate: profile, Python: "python3", SuiteInterval: 1 << 40, ReadProbeMB: 1,
	}
	if err := o.Validate(false); err != nil {
		t.Fatal(err)
	}
	return o
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestIdentityKeptAcrossRestarts(t *testing.T) {
	t.Parallel()
	o := simOptions(t, "h100-sxm5-8x")
	a1, err := New(o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(o.StateDir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("identity key mode %04o, want 0600", fi.Mode().Perm())
	}
	a2, err := New(o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a1.PublicKeyPEM(), a2.PublicKeyPEM()) {
		t.Error("restart changed the agent identity")
	}
	pub, _ := os.ReadFile(filepath.Join(o.StateDir, PublicKeyFile))
	if !bytes.Equal(pub, a1.PublicKeyPEM()) {
		t.Error("agent.pub differs from the identity key")
	}
	r1, _ := a1.RunOnce(context.Background())
	r2, _ := a2.RunOnce(context.Background())
	if r1.Report.GPUs[0].UUID != r2.Report.GPUs[0].UUID {
		t.Error("simulated GPU UUIDs changed across a restart")
	}
	other, _ := New(simOptions(t, "h100-sxm5-8x"), quiet())
	r3, _ := other.RunOnce(context.Background())
	if r3.Report.GPUs[0].UUID == r1.Report.GPUs[0].UUID {
		t.Error("two simulated nodes share GPU UUIDs")
	}
	if err := os.Chmod(filepath.Join(o.StateDir, KeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(o, quiet()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key accepted: %v", err)
	}
}

func TestQueryEndpoint(t *testing.T) {
	t.Parallel()
	a, err := New(simOptions(t, "h100-sxm5-8x"), quiet())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.QueryHandler())
	defer srv.Close()
	get := func(method, path string, body []byte) (int, []byte) {
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, _ := get("GET", "/v1/report", nil)
	if code != http.StatusServiceUnavailable {
		t.Errorf("report before the first run: %d", code)
	}
	code, b := get("GET", "/v1/fingerprint", nil)
	var fp Fingerprint
	if code != 200 || json.Unmarshal(b, &fp) != nil {
		t.Fatalf("GET fingerprint: %d %s", code, b)
	}
	sr, _ := a.RunOnce(context.Background())
	if fp.RuntimeFingerprint != sr.Report.RuntimeFingerprint || !fp.Simulated || fp.Profile != "h100-sxm5-8x" {
		t.Errorf("fingerprint %+v, report says %s", fp, sr.Report.RuntimeFingerprint)
	}
	tests := []struct {
		file      string
		match     bool
		wantFails []string
	}{
		{"h100.yaml", true, nil},
		{"h100-other-torch.yaml", false, []string{"torch.version"}},
	}
	for _, tt := range tests {
		specBytes, err := os.ReadFile(filepath.Join("testdata", tt.file))
		if err != nil {
			t.Fatal(err)
		}
		code, b := get("POST", "/v1/fingerprint", specBytes)
		var got Fingerprint
		if code != 200 || json.Unmarshal(b, &got) != nil || got.Match == nil {
			t.Fatalf("POST %s: %d %s", tt.file, code, b)
		}
		var fails []string
		for _, c := range got.Failed {
			fails = append(fails, c.Name)
		}
		if *got.Match != tt.match || strings.Join(fails, ",") != strings.Join(tt.wantFails, ",") {
			t.Errorf("%s: match=%v failed=%v, want %v %v", tt.file, *got.Match, fails, tt.match, tt.wantFails)
		}
		if tt.match && got.RuntimeFingerprint != got.SpecFingerprint {
			t.Errorf("%s: match but fingerprints differ", tt.file)
		}
	}
	code, b = get("POST", "/v1/fingerprint", []byte("runtime: [oops"))
	if code != http.StatusBadRequest || !strings.Contains(string(b), "findings") {
		t.Errorf("bad spec: %d %s", code, b)
	}
	code, b = get("GET", "/v1/report", nil)
	var rep struct {
		Report    *conformance.Report `json:"report"`
		Signature string              `json:"signature"`
	}
	if code != 200 || json.Unmarshal(b, &rep) != nil || rep.Signature == "" || len(rep.Report.Checks) != len(suite.CheckNames) {
		t.Errorf("GET report: %d %s", code, b)
	}
	code, _ = get("POST", "/v1/conformance/run", nil)
	if code != http.StatusServiceUnavailable {
		t.Errorf("on-demand run without the main loop: %d, want 503", code)
	}
}

// reportBroker takes reports and counts them.
type reportBroker struct {
	gpupassv1connect.UnimplementedAgentServiceHandler
	n *atomic.Int32
}

func (b reportBroker) UploadReport(context.Context, *connect.Request[gpupassv1.UploadReportRequest]) (*connect.Response[gpupassv1.UploadReportResponse], error) {
	b.n.Add(1)
	return connect.NewResponse(&gpupassv1.UploadReportResponse{Passed: true}), nil
}

// enrolledSimAgent is a simulated agent, known as agt-1 to a loopback
// broker that takes its reports; uploads counts them.
func enrolledSimAgent(t *testing.T) (a *Agent, cp ControlPlane, uploads *atomic.Int32) {
	t.Helper()
	uploads = new(atomic.Int32)
	mux := http.NewServeMux()
	mux.Handle(gpupassv1connect.NewAgentServiceHandler(reportBroker{n: uploads}))
	broker := serveGRPC(t, mux)
	clients, err := client.Dial(broker.URL, client.Options{Token: "tok", GRPC: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err = New(simOptions(t, "h100-sxm5-8x"), quiet())
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.agentID = "agt-1"
	a.mu.Unlock()
	return a, NewControlPlane(clients), uploads
}

// TestSuiteHeldDuringRun: while a run is in progress, neither the
// periodic suite nor the broker's request for a fresh report measures the
// node (the run's own processes hold the GPUs and its disk); once the run
// is over, both measure and upload again.
func TestSuiteHeldDuringRun(t *testing.T) {
	t.Parallel()
	a, clients, uploads := enrolledSimAgent(t)
	ctx := t.Context()
	measured := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.last != nil
	}

	done := a.busy()
	if err := a.periodic(ctx, clients); err != nil {
		t.Fatal(err)
	}
	if err := a.upload(ctx, clients); err != nil { // the broker's ReportWanted
		t.Fatal(err)
	}
	if measured() || uploads.Load() != 0 {
		t.Fatalf("during a run: measured %v, %d reports uploaded; want neither", measured(), uploads.Load())
	}
	done()
	done() // once only
	if n := a.runs.Load(); n != 0 {
		t.Fatalf("%d runs in progress after the run's done was called twice, want 0", n)
	}
	if err := a.periodic(ctx, clients); err != nil {
		t.Fatal(err)
	}
	if !measured() || uploads.Load() != 1 {
		t.Errorf("after the run: measured %v, %d reports uploaded; want a report", measured(), uploads.Load())
	}
}

// TestReportEndpointDuringUpload: GET /v1/report encodes the last report
// (its uploaded flag included) while the main loop uploads it and marks
// it uploaded. Run with -race: the endpoint must read a copy taken under
// the agent's lock.
func TestReportEndpointDuringUpload(t *testing.T) {
	t.Parallel()
	a, clients, _ := enrolledSimAgent(t)
	ctx := t.Context()
	if _, err := a.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	q := a.QueryHandler()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			q.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/report", nil))
		}
	}()
	// Each upload after the first measures a new report and marks it.
	for range 5 {
		if err := a.upload(ctx, clients); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	rec := httptest.NewRecorder()
	q.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/report", nil))
	var got struct {
		Uploaded bool `json:"uploaded"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || !got.Uploaded {
		t.Errorf("GET /v1/report after the upload: %d %s (%v), want uploaded true", rec.Code, rec.Body, err)
	}
}
