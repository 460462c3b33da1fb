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

// CIStep runs the audit or audit-verify CI step.
func (Plugin) CIStep(ctx context.Context, o *gpupass.CIStepOptions, env *ci.Env, out io.Writer) error {
	end := env.Group("gpupass " + o.Command)
	defer end()
	if o.Command == "audit-verify" {
		if err := o.Require("cosign-key", o.CosignKey); err != nil {
			return err
		}
		key, done, err := o.KeyFile()
		if err != nil {
			return err
		}
		defer done()
		var agentKeys []string
		if o.AgentKey != "" {
			ak, adone, err := o.AgentKeyFile()
			if err != nil {
				return err
			}
			defer adone()
			agentKeys = []string{ak}
		}
		return RunAuditVerify(ctx, AuditVerifyOptions{Path: o.AuditPath, Key: key, AgentKeys: agentKeys, Output: "text", Getenv: o.Getenv}, out)
	}
	return ciAudit(ctx, o, env, out)
}

func ciAudit(ctx context.Context, o *gpupass.CIStepOptions, env *ci.Env, out io.Writer) error {
	if o.Allocation == "" && o.RunFile == "" {
		return o.Require("allocation", "")
	}
	if err := o.Require("cosign-key", o.CosignKey); err != nil {
		return err
	}
	key, done, err := o.KeyFile()
	if err != nil {
		return err
	}
	defer done()
	a := AuditOptions{
		AllocationID: o.Allocation, Out: o.AuditPath, RunFile: o.RunFile, Key: key, Output: "text",
		Broker: *o.Broker(), Getenv: o.Getenv, Log: o.Logger,
	}
	if o.CosignPassword != "" {
		a.Password = []byte(o.CosignPassword)
	}
	if err := RunAudit(ctx, a, out); err != nil {
		return err
	}
	return env.SetOutput("audit-path", o.AuditPath)
}
