package bundlecmd

import (
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Command is the `bundle` command tree, for gpupass.WithCommands, with
// the registry library's fields renamed to its flags.
var Command = gpupass.Subcommand{
	Name: "bundle",
	New:  newBundleCmd,
	FieldNames: fielderr.Names{
		bundle.FieldMountFrom: "--mount-from",
		bundle.FieldUsername:  "--registry-username",
		bundle.FieldPassword:  "--registry-password",
		bundle.FieldPlainHTTP: "--plain-http (GPUPASS_PLAIN_HTTP=true)",
		"jobs":                "--jobs",
	},
}
