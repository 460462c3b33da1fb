package auditcmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
)

// Issue #35: `gpupass audit GROUP` is refused, an audit report proving
// one run, with the command that audits each run of the group, read from
// the broker; no zip is written.
func TestAuditGroupNamesEachRun(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	run := brokertest.StartRun(t, b, "us-west-2").Run
	if run.Group == "" {
		t.Fatal("the broker drew no group for the run")
	}
	zipPath := filepath.Join(t.TempDir(), "audit-report.zip")
	reader := gpupass.BrokerFlags{URL: b.URL, Token: b.Token(t, store.RoleRead, "us-west-2")}
	want := "audit each of its 1 runs: gpupass audit " + run.Id + " --out audit-us-west-2.zip"
	// In a CI step (no key given) as on the command line.
	for _, kind := range []output.Format{output.Text, output.GitHub} {
		var out bytes.Buffer
		err := RunAudit(context.Background(), AuditOptions{AllocationID: run.Group, Out: zipPath, Broker: reader, Output: kind, ErrOut: &out,
			Getenv: func(string) string { return "" }}, &out)
		if gpupass.ExitCode(err) != gpupass.ExitUsage || !strings.Contains(err.Error(), want) {
			t.Fatalf("audit %s (-o %s): exit %d, %v; want %d saying %q", run.Group, kind, gpupass.ExitCode(err), err, gpupass.ExitUsage, want)
		}
		if strings.Contains(err.Error()+out.String(), reader.Token) {
			t.Error("the token reached the output")
		}
	}
	if _, err := os.Stat(zipPath); err == nil {
		t.Error("audit of a group wrote a zip")
	}
}
