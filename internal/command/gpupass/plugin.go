package gpupass

import (
	"slices"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/command/executorflags"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// The audit and bundle command trees live in subpackages (auditcmd,
// bundlecmd) that import this one for its options and helpers, so this
// package cannot import them: cmd/gpupass, which links everything, hands
// them in (WithCommands, WithPoster), as woodpecker's cli main
// assembles its command packages. gpupass is one binary: a start-up of
// ~9 ms more for every process (sigstore's, the registry client's and
// the forge clients' package initialisation) buys one install instead
// of two and no "install the other binary" failure (CHANGELOG.md).

// Subcommand is a top-level command of gpupass: the name it answers to
// (TestCommandNames keeps it true) and how to build it.
type Subcommand struct {
	Name string
	New  func(*GlobalOptions) *cobra.Command
	// FieldNames rename its libraries' fields to the flags that set them
	// (see flagNames); nil for the commands of this package, whose names
	// are in flagNames.
	FieldNames fielderr.Names
}

// Option configures Main and NewRoot.
type Option func(*rootConfig)

type rootConfig struct {
	commands []Subcommand   // this package's and those linked in
	poster   compare.Poster // nil: compare cannot post (compare.ErrNoPoster)
	names    fieldNames
	// executors: GlobalOptions.Executors.
	executors []executorflags.Executor
}

// WithCommands links top-level commands of other packages in
// (cmd/gpupass links auditcmd.Command and bundlecmd.Command).
func WithCommands(cs ...Subcommand) Option {
	return func(c *rootConfig) { c.commands = append(c.commands, cs...) }
}

// WithPoster links posting compare reports to the forges in (cmd/gpupass
// does).
func WithPoster(p compare.Poster) Option { return func(c *rootConfig) { c.poster = p } }

// WithExecutors gives up the flags of es instead of the executors gpupass
// was built with (gpupass-docs, from the agent's own; tests, with the
// fake executor's).
func WithExecutors(es []executorflags.Executor) Option {
	return func(c *rootConfig) { c.executors = es }
}

// newRootConfig is this package's commands with opts applied.
func newRootConfig(opts []Option) *rootConfig {
	c := &rootConfig{commands: slices.Clone(commands)}
	for _, o := range opts {
		o(c)
	}
	c.names = newFieldNames(c.commands)
	return c
}
