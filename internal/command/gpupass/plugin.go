package gpupass

import (
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// The audit and bundle command trees live in subpackages (auditcmd,
// bundlecmd) that import this one for its options and helpers, so this
// package cannot import them: cmd/gpupass, which links everything, hands
// them in (WithAudit, WithBundle, WithPoster), as woodpecker's cli main
// assembles its command packages. gpupass is one binary: a start-up of
// ~9 ms more for every process (sigstore's, the registry client's and
// the forge clients' package initialisation) buys one install instead
// of two and no "install the other binary" failure (CHANGELOG.md).

// Plugin provides a command tree that lives in a subpackage.
type Plugin interface {
	// Command returns the command tree (`audit`, `bundle`).
	Command(g *GlobalOptions) *cobra.Command
	// FieldNames rename its libraries' fields to the flags that set them
	// (see flagNames).
	FieldNames() fielderr.Names
}

// Option configures Main and NewRoot.
type Option func(*rootConfig)

type rootConfig struct {
	audit  Plugin
	bundle Plugin
	poster compare.Poster // nil: compare cannot post (compare.ErrNoPoster)
	names  fieldNames
}

// WithAudit links the audit commands in (cmd/gpupass does).
func WithAudit(p Plugin) Option { return func(c *rootConfig) { c.audit = p } }

// WithBundle links the bundle commands in (cmd/gpupass does).
func WithBundle(p Plugin) Option { return func(c *rootConfig) { c.bundle = p } }

// WithPoster links posting compare reports to the forges in (cmd/gpupass
// does).
func WithPoster(p compare.Poster) Option { return func(c *rootConfig) { c.poster = p } }

// pluginCommands name the command trees of the audit and bundle plugins,
// in that order.
var pluginCommands = []string{"audit", "bundle"}
