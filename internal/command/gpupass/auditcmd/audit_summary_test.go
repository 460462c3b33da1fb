package auditcmd

import (
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/app/auditrun"
	"github.com/gpupass/gpupass/internal/audit"
)

// The CI step's summary of a group signed keyless names the job's
// identity once and the command that verifies the whole directory; a
// group signed with a key says so and names no identity.
func TestGroupSummary(t *testing.T) {
	t.Parallel()
	sb := &audit.SignedBy{Identity: "https://github.com/acme/train/.github/workflows/ci.yml@refs/heads/main", Issuer: "https://token.actions.githubusercontent.com",
		Repository: "https://github.com/acme/train", Ref: "refs/heads/main", Commit: "0123abcd"}
	g := groupWritten{
		{Region: "us-west-2", AuditResult: &auditrun.Result{Path: "audit-g/audit-us-west-2.zip", Signing: "keyless", SignedBy: sb}},
		{Region: "eu-central-1", Skipped: "ended before it started", SkippedAllocation: "alloc-2"},
	}
	got := g.summary("group-3f9a", "audit-g", "my root.json")
	for _, want := range []string{"Wrote 1 signed zip(s) of run group `group-3f9a` into `audit-g`.", "| identity | `" + sb.Identity + "` |",
		"| commit | `0123abcd` |", "gpupass audit verify audit-g --certificate-identity " + sb.Identity + " --certificate-oidc-issuer " + sb.Issuer + " --trusted-root 'my root.json'"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	g[0].SignedBy, g[0].Signing = nil, "key"
	if got := g.summary("group-3f9a", "audit-g", ""); strings.Contains(got, "Signed keyless") || strings.Contains(got, "verify") {
		t.Errorf("a key-signed group's summary names a keyless signer:\n%s", got)
	}
}
