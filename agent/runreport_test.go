package agent_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil"
)

// systemPython has Debian's python3-numpy, which the example spec pins.
const systemPython = "/usr/bin/python3"

// TestRunReportKeptByBroker runs real jobs through a real agent on the
// simulated a100 profile: at runtime-init the agent signs a report for the
// run (packages checked in the run's Python) and the broker keeps it. A
// matching spec gives a report whose fingerprint equals the spec's; a spec
// pinning another numpy gives a signed report saying so, and a failed run.
func TestRunReportKeptByBroker(t *testing.T) {
	t.Parallel()
	if err := exec.Command(systemPython, "-c", "import numpy").Run(); err != nil {
		testutil.Missing(t, "%s with numpy (python3-numpy)", systemPython)
	}
	ctx := context.Background()
	url, st := startBroker(t)
	stateDir := t.TempDir()
	o := &agent.Options{
		BrokerURL: url, Token: token(t, st, store.RoleAgent, "*"), StateDir: stateDir, QueryAddr: "127.0.0.1:0",
		Provider: "sim", Region: "us-west-2", Zone: "us-west-2a", PricePerHour: 2.5, StorageClass: "standard", BandwidthGbps: 25,
		Python: systemPython, Simulate: "a100-80gb-4x", SuiteInterval: time.Hour, ReadProbeMB: 1,
	}
	if err := o.Validate(true); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() { stop(); <-done })

	c, err := client.DialRuns(url, client.Options{Token: token(t, st, store.RoleSubmit, "us-*")})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := client.DialRuns(url, client.Options{Token: token(t, st, store.RoleRead, "us-west-2")})
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join("..", "examples", "train", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, specYAML []byte) (*gpupassv1.Run, *gpupassv1.GetRunEvidenceResponse) {
		t.Helper()
		var r *gpupassv1.Run
		deadline := time.Now().Add(90 * time.Second)
		for {
			// The node certifies a moment after the agent starts.
			resp, err := c.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
				SpecYaml: specYAML, Region: "us-west-2", Command: []string{systemPython, "-c", "print('hi')"}}))
			if err != nil {
				t.Fatal(err)
			}
			if r = resp.Msg.Run; r.NodeId != "" || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if r.NodeId == "" {
			t.Fatalf("run never placed: %v %s", r.State, r.Reason)
		}
		for r.State < gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			if time.Now().After(deadline) {
				t.Fatalf("run %s still %v", r.Id, r.State)
			}
			time.Sleep(100 * time.Millisecond)
			g, err := reader.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: r.Id}))
			if err != nil {
				t.Fatal(err)
			}
			r = g.Msg.Run
		}
		ev, err := reader.Run.GetRunEvidence(ctx, connect.NewRequest(&gpupassv1.GetRunEvidenceRequest{AllocId: r.Id}))
		if err != nil {
			t.Fatalf("GetRunEvidence of %s (%v %s): %v", r.Id, r.State, r.Reason, err)
		}
		return r, ev.Msg
	}
	check := func(t *testing.T, r *gpupassv1.Run, ev *gpupassv1.GetRunEvidenceResponse) *conformance.Report {
		t.Helper()
		pub, err := os.ReadFile(filepath.Join(stateDir, agent.PublicKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ev.AgentPublicKeyPem, pub) {
			t.Errorf("the broker keeps another key than the agent's")
		}
		if err := conformance.Verify(pub, ev.Report, ev.Signature); err != nil {
			t.Fatalf("the run report does not verify with the agent's key: %v", err)
		}
		rep, err := conformance.Parse(ev.Report)
		if err != nil {
			t.Fatal(err)
		}
		if rep.AllocationID != r.Id || rep.SpecFingerprint != r.SpecFingerprint || !rep.Simulated {
			t.Errorf("report binds alloc %q spec %q simulated %v; want %s %s true", rep.AllocationID, rep.SpecFingerprint, rep.Simulated, r.Id, r.SpecFingerprint)
		}
		return rep
	}
	checkNamed := func(rep *conformance.Report, name string) conformance.Check {
		for _, c := range rep.Checks {
			if c.Name == name {
				return c
			}
		}
		return conformance.Check{}
	}

	t.Run("matching spec", func(t *testing.T) {
		r, ev := run(t, example)
		if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Fatalf("run %v: %s", r.State, r.Reason)
		}
		rep := check(t, r, ev)
		if rep.RuntimeFingerprint != r.SpecFingerprint {
			t.Errorf("runtime fingerprint %s differs from the spec's %s on a matching node; report runtime %+v", rep.RuntimeFingerprint, r.SpecFingerprint, rep.Runtime)
		}
		if c := checkNamed(rep, "package.numpy"); c.Status != conformance.Pass || c.Expected != "1.24.2" {
			t.Errorf("package.numpy = %+v, want pass against 1.24.2", c)
		}
		if !strings.Contains(strings.Join(rep.Notes, "\n"), "run's Python "+systemPython) {
			t.Errorf("notes do not name the run's Python: %q", rep.Notes)
		}
	})
	t.Run("package differs", func(t *testing.T) {
		r, ev := run(t, bytes.Replace(example, []byte("numpy==1.24.2"), []byte("numpy==1.24.3"), 1))
		if r.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(r.Reason, "numpy") {
			t.Errorf("run %v %q, want failed on numpy", r.State, r.Reason)
		}
		rep := check(t, r, ev)
		if rep.RuntimeFingerprint == r.SpecFingerprint {
			t.Error("the fingerprint matches although numpy differs")
		}
		if c := checkNamed(rep, "package.numpy"); c.Status != conformance.Fail || c.Actual != "1.24.2" {
			t.Errorf("package.numpy = %+v, want fail with 1.24.2 installed", c)
		}
	})
}
