package bundlecmd

import (
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Plugin is the gpupass.Plugin with the bundle commands linked in.
type Plugin struct{}

var _ gpupass.Plugin = Plugin{}

// Command returns the `bundle` command tree.
func (Plugin) Command(g *gpupass.GlobalOptions) *cobra.Command { return newBundleCmd(g) }

// FieldNames rename the registry library's fields to the bundle
// commands' flags.
func (Plugin) FieldNames() fielderr.Names {
	return fielderr.Names{
		bundle.FieldMountFrom: "--mount-from",
		bundle.FieldUsername:  "--registry-username",
		bundle.FieldPassword:  "--registry-password",
		bundle.FieldPlainHTTP: "--plain-http (GPUPASS_PLAIN_HTTP=true)",
		"jobs":                "--jobs",
	}
}
