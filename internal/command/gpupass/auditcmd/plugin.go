// Package auditcmd holds the audit commands: `gpupass audit` (build and
// sign a run's audit report; with -o github|gitlab the audit CI step),
// `audit verify` (the audit-verify step) and `audit keygen`. They link
// sigstore; cmd/gpupass links them in (Command).
package auditcmd

import (
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Command is the `audit` command tree, for gpupass.WithCommands, with
// the audit library's fields renamed to its flags.
var Command = gpupass.Subcommand{
	Name: "audit",
	New:  newAuditCmd,
	FieldNames: fielderr.Names{
		audit.FieldKey:     "--key",
		audit.FieldKeyless: "--keyless",
		// Verify reads the trusted root too; audit verify's own table
		// is the same.
		audit.FieldSigningConfig: "--signing-config",
		audit.FieldTrustedRoot:   "--trusted-root",
		audit.FieldIdentityToken: "--identity-token",
		audit.FieldForce:         "key pair (--force replaces it)",
	},
}
