package gpupass

import (
	"io"

	"github.com/spf13/cobra"
)

// What the audit and bundle commands (packages auditcmd and bundlecmd,
// which cmd/gpupass links in) share with the other commands.

// AllocArg checks that a command got exactly one allocation id.
func AllocArg(cmd *cobra.Command, args []string) error { return allocArg(cmd, args) }

// WriteJSON writes v as indented JSON (the -o json output of every command).
func WriteJSON(w io.Writer, v any) error { return writeJSON(w, v) }

// RPCError says what failed calling the broker at url, in the words every
// command uses (no token, the status the broker answered).
func RPCError(what, url string, err error) error { return rpcError(what, url, err) }

// IsTerminal reports whether w is a terminal (progress bars or lines).
func IsTerminal(w io.Writer) bool { return isTerminal(w) }
