// Package auditcmd holds the audit commands: `gpupass audit` (build and
// sign a run's audit report; with -o github|gitlab the audit CI step),
// `audit verify` (the audit-verify step) and `audit keygen`. They link
// sigstore; cmd/gpupass links them in (see gpupass.Plugin).
package auditcmd

import (
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Plugin is the gpupass.Plugin with the audit commands linked in.
type Plugin struct{}

var _ gpupass.Plugin = Plugin{}

// Command returns the `audit` command tree.
func (Plugin) Command(g *gpupass.GlobalOptions) *cobra.Command { return newAuditCmd(g) }

// FieldNames rename the audit library's fields to the audit commands'
// flags.
func (Plugin) FieldNames() fielderr.Names {
	return fielderr.Names{
		audit.FieldKey:     "--key",
		audit.FieldKeyless: "--keyless",
		audit.FieldForce:   "key pair (--force replaces it)",
	}
}
