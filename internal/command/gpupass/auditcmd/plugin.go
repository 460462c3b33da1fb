// Package auditcmd holds the audit commands: `gpupass audit` (build and
// sign a run's audit report), `audit verify`, `audit keygen` and the audit
// and audit-verify CI steps. They link sigstore; cmd/gpupass links them in
// (see gpupass.Plugin).
package auditcmd

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Plugin is the gpupass.Plugin with the audit commands linked in.
type Plugin struct{}

var _ gpupass.Plugin = Plugin{}

// Command returns the `audit` command tree.
func (Plugin) Command(g *gpupass.GlobalOptions) *cobra.Command { return newAuditCmd(g) }

// FieldNames rename the audit library's fields to the audit commands'
// flags and the audit steps' inputs.
func (Plugin) FieldNames() (flags, inputs fielderr.Names) {
	return fielderr.Names{
			audit.FieldKey:     "--key",
			audit.FieldKeyless: "--keyless",
			audit.FieldForce:   "key pair (--force replaces it)",
		}, fielderr.Names{
			audit.FieldKey: "input cosign-key",
		}
}

// CIStep runs the audit or audit-verify CI step: the real command with
// the CI output format of env.
func (Plugin) CIStep(ctx context.Context, o *gpupass.CIStepOptions, env *ci.Env, out io.Writer) error {
	output := string(env.Kind())
	if env.Kind() == ci.None {
		output = "text"
	}
	if o.Command == "audit-verify" {
		v := AuditVerifyOptions{Path: o.AuditPath, Key: o.CosignKey, Output: output, Getenv: o.Getenv, ErrOut: o.ErrOut}
		if o.AgentKey != "" {
			v.AgentKeys = []string{o.AgentKey}
		}
		return RunAuditVerify(ctx, v, out)
	}
	a := AuditOptions{
		AllocationID: o.Allocation, Out: o.AuditPath, RunFile: o.RunFile, Key: o.CosignKey, Output: output,
		Broker: *o.Broker(), Getenv: o.Getenv, Log: o.Logger, ErrOut: o.ErrOut,
	}
	if o.CosignPassword != "" {
		a.Password = []byte(o.CosignPassword)
	}
	return RunAudit(ctx, a, out)
}
