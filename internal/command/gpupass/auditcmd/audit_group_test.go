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
	each := ": gpupass audit " + run.Id + " --out audit-us-west-2.zip"
	pem := "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nc2VjcmV0\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----"
	// The per-run commands sign as the user asked, so that they run as
	// pasted (audit refuses to sign without a key); a PEM is never echoed.
	for _, tt := range []struct {
		kind    output.Format
		key     string
		keyless bool
		want    string
	}{
		{output.Text, "", false, "audit each of its 1 runs (with a cosign.key from gpupass audit keygen)" + each + " --key cosign.key"},
		{output.GitHub, "", false, "audit each of its 1 runs (with a cosign.key from gpupass audit keygen)" + each + " --key cosign.key"},
		{output.Text, "keys/my key.pem", false, "runs" + each + " --key 'keys/my key.pem'"},
		{output.Text, "env://AUDIT_KEY", false, "runs" + each + " --key env://AUDIT_KEY"},
		{output.Text, "", true, "runs" + each + " --keyless"},
		{output.GitHub, pem, false, "runs" + each},
	} {
		var out bytes.Buffer
		err := RunAudit(context.Background(), AuditOptions{AllocationID: run.Group, Out: zipPath, Broker: reader, Output: tt.kind, ErrOut: &out,
			Key: tt.key, Keyless: tt.keyless, Getenv: func(string) string { return "" }}, &out)
		if gpupass.ExitCode(err) != gpupass.ExitUsage || !strings.HasSuffix(err.Error(), tt.want) {
			t.Fatalf("audit %s (-o %s, key %q, keyless %v): exit %d, %v; want %d ending %q", run.Group, tt.kind, tt.key, tt.keyless, gpupass.ExitCode(err), err, gpupass.ExitUsage, tt.want)
		}
		if strings.Contains(err.Error()+out.String(), reader.Token) || strings.Contains(err.Error(), "c2VjcmV0") {
			t.Error("the token or the key reached the output")
		}
	}
	if _, err := os.Stat(zipPath); err == nil {
		t.Error("audit of a group wrote a zip")
	}
}
