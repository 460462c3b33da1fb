package modelcmd

import (
	"sort"

	"github.com/gpupass/gpupass/internal/app/modelprov"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/model"
)

// Command is the `model` command tree, for gpupass.WithCommands, with the
// libraries' fields renamed to its flags.
var Command = gpupass.Subcommand{
	Name: "model",
	New:  newModelCmd,
	FieldNames: fielderr.Names{
		audit.FieldKey:           "--key",
		audit.FieldKeyless:       "--keyless",
		audit.FieldSigningConfig: "--signing-config",
		audit.FieldTrustedRoot:   "--trusted-root",
		audit.FieldIdentityToken: "--identity-token",
		model.FieldFile:          "--file",
		model.FieldMaxSize:       "--max-size",
		model.FieldRef:           "REF",
		modelprov.FieldAudit:     "--audit",
		modelprov.FieldCommit:    "--commit",
		bundle.FieldUsername:     "--registry-username",
		bundle.FieldPassword:     "--registry-password",
		bundle.FieldPlainHTTP:    "--plain-http (GPUPASS_PLAIN_HTTP=true)",
	},
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
