package gpupass

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestDisputedLogInTheCLI: a run whose agent sent seq 7 twice with
// different content (the broker kept the first, refused the second)
// ends "succeeded", and every command that shows its log or judges its
// figures says the log is disputed: logs (a WARN line, and exit 1 when
// following), runs (a marker), compare (inconclusive, exit 1 with
// --fail-on-divergence) and audit (recorded; verify fails the log
// layer). Before, the second record vanished without a trace.
func TestDisputedLogInTheCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := auditFixture(t)
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	l := brokertest.StartRun(t, b, "us-west-2")
	run := l.Run
	point := func(step int, loss float64) *gpupassv1.Record {
		return brokertest.MetricRecord(uint64(step), step, fmt.Sprintf(`"loss":%g`, loss))
	}
	var recs []*gpupassv1.Record
	var jsonl bytes.Buffer
	for step := 1; step <= 20; step++ {
		recs = append(recs, point(step, 4.0/float64(step)))
		fmt.Fprintf(&jsonl, `{"step":%d,"loss":%g}`+"\n", step, 4.0/float64(step))
	}
	upload := func(recs ...*gpupassv1.Record) *gpupassv1.UploadRecordsResponse {
		t.Helper()
		resp, err := l.Upload(recs...)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	upload(recs...)
	if resp := upload(point(7, 0.001)); len(resp.DisputedSeqs) != 1 || resp.DisputedSeqs[0] != 7 || resp.HeldThrough != 20 {
		t.Fatalf("second, different seq 7: reply %v; want it refused (disputed_seqs [7]), held 20", resp)
	}
	l.Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 20)

	reader := BrokerFlags{URL: b.URL, Token: b.Token(t, store.RoleRead, "us-west-2")}
	const note = "log disputed: 1 record(s) were sent twice with different content (first at seq 7)"

	t.Run("logs", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := RunLogs(ctx, &LogsOptions{Global: &GlobalOptions{Output: "text"}, Broker: reader, AllocID: run.Id, Metrics: true}, &out, &errOut)
		if err != nil || !strings.Contains(errOut.String(), "WARN "+note) || !strings.Contains(errOut.String(), "not proof") {
			t.Errorf("logs: %v; stderr lacks the WARN %q:\n%s", err, note, errOut.String())
		}
		if !strings.Contains(out.String(), "step=7 attempt=1 {\"loss\":0.5714285714285714}") {
			t.Errorf("logs do not show the first seq 7 (the one kept):\n%s", out.String())
		}
		out.Reset()
		errOut.Reset()
		err = RunLogs(ctx, &LogsOptions{Global: &GlobalOptions{Output: "json"}, Broker: reader, AllocID: run.Id, Follow: true}, &out, &errOut)
		if ExitCode(err) != ExitFindings || !strings.Contains(fmt.Sprint(err), note) || strings.Contains(out.String(), "disputed") {
			t.Errorf("logs --follow -o json: exit %d, %v, stdout %q; want exit 1 naming the dispute, stdout JSON only", ExitCode(err), err, out.String())
		}
	})

	t.Run("runs", func(t *testing.T) {
		var out bytes.Buffer
		if err := RunRuns(ctx, &RunsOptions{Global: &GlobalOptions{Output: "text"}, Broker: reader, Limit: 50}, &out); err != nil || !strings.Contains(out.String(), "succeeded, simulated, LOG DISPUTED") {
			t.Errorf("runs: %v\n%s\nwant the run marked LOG DISPUTED", err, out.String())
		}
	})

	t.Run("compare", func(t *testing.T) {
		clean := filepath.Join(t.TempDir(), "clean.jsonl")
		if err := os.WriteFile(clean, jsonl.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err := RunCompare(ctx, &CompareOptions{Inputs: []string{clean, run.Id}, Tolerance: "5%", FailOnDivergence: true, Post: "none",
			CommentBehavior: "update", Source: brokerSource(&reader)}, &out)
		md := out.String()
		if ExitCode(err) != ExitFindings || !strings.Contains(fmt.Sprint(err), note) {
			t.Errorf("compare --fail-on-divergence: exit %d, %v; want exit 1 naming the dispute", ExitCode(err), err)
		}
		for _, want := range []string{"gpupass compare: inconclusive", "**Log disputed** (us-west-2)", "⚠️ log disputed: us-west-2"} {
			if !strings.Contains(md, want) {
				t.Errorf("compare report lacks %q (the curves agree; only the dispute keeps it from consistent):\n%s", want, md)
			}
		}
	})

	// audit lives in auditcmd, which cmd/gpupass links: run the binary.
	t.Run("audit", func(t *testing.T) {
		bin := testutil.BuildBinary(t, "./cmd/gpupass")
		zipPath := filepath.Join(dir, "disputed-audit.zip")
		audit := func(args ...string) (string, int) {
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=gpupass-test")
			out, _, code := testutil.Run(t, cmd)
			return out, code
		}
		out, code := audit("audit", run.Id, "--out", zipPath, "--key", filepath.Join(dir, "cosign.key"), "--broker-url", reader.URL, "--broker-token", reader.Token)
		if code != ExitOK {
			t.Fatalf("audit: exit %d\n%s", code, out)
		}
		if !strings.Contains(out, note) {
			t.Errorf("audit output does not say the log is disputed:\n%s", out)
		}
		vout, code := audit("audit", "verify", zipPath, "--key", filepath.Join(dir, "cosign.pub"))
		if code != ExitFindings || !strings.Contains(vout, "FAIL log") || !strings.Contains(vout, note) {
			t.Errorf("audit verify: exit %d; want exit 1 with the log layer failed:\n%s", code, vout)
		}
	})
}

// TestDisputedLogWhileRunning: a run whose log is disputed while it
// still runs is no proof either. compare --allow-running, whose curves
// agree with a clean copy, is inconclusive (exit 1 with
// --fail-on-divergence), not consistent; --partial's in-progress report
// says the log is disputed. Before, the dispute was read only once the
// run had ended.
func TestDisputedLogWhileRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	l := brokertest.StartRun(t, b, "us-west-2")
	var recs []*gpupassv1.Record
	var jsonl bytes.Buffer
	for step := 1; step <= 10; step++ {
		recs = append(recs, brokertest.MetricRecord(uint64(step), step, fmt.Sprintf(`"loss":%g`, 4.0/float64(step))))
		fmt.Fprintf(&jsonl, `{"step":%d,"loss":%g}`+"\n", step, 4.0/float64(step))
	}
	if _, err := l.Upload(recs...); err != nil {
		t.Fatal(err)
	}
	if resp, err := l.Upload(brokertest.MetricRecord(7, 7, `"loss":0.001`)); err != nil || len(resp.DisputedSeqs) != 1 {
		t.Fatalf("second, different seq 7: %v, %v; want it refused as disputed", resp, err)
	}
	clean := filepath.Join(t.TempDir(), "clean.jsonl")
	if err := os.WriteFile(clean, jsonl.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	reader := BrokerFlags{URL: b.URL, Token: b.Token(t, store.RoleRead, "us-west-2")}
	const note = "log disputed: 1 record(s) were sent twice with different content (first at seq 7)"
	compare := func(flag string) (string, error) {
		var out bytes.Buffer
		o := &CompareOptions{Inputs: []string{clean, l.Run.Id}, Tolerance: "5%", FailOnDivergence: true, Post: "none", CommentBehavior: "update", Source: brokerSource(&reader)}
		o.AllowRunning, o.Partial = flag == "--allow-running", flag == "--partial"
		err := RunCompare(ctx, o, &out)
		return out.String(), err
	}
	md, err := compare("--allow-running")
	if ExitCode(err) != ExitFindings || !strings.Contains(fmt.Sprint(err), note) || !strings.Contains(md, "gpupass compare: inconclusive") {
		t.Errorf("compare --allow-running --fail-on-divergence: exit %d, %v; want 1, inconclusive, naming the dispute:\n%s", ExitCode(err), err, md)
	}
	md, err = compare("--partial")
	if err != nil || !strings.Contains(md, "gpupass compare: in progress") || !strings.Contains(md, "**Log disputed** (us-west-2): "+note) {
		t.Errorf("compare --partial: %v; want the in-progress report to say the log is disputed:\n%s", err, md)
	}
}

// auditFixture copies the audit package's fixture (run record, cosign key
// pair encrypted with "gpupass-test", agent key) into a temp dir.
func auditFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"run.json", "cosign.key", "cosign.pub", "agent.pub"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "audit", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
