package gpupass

import "github.com/gpupass/gpupass/internal/exitcode"

// Exit codes of every gpupass command (package exitcode holds them for all
// three binaries). They are part of the CLI contract: never renumber.
const (
	ExitOK       = exitcode.OK
	ExitFindings = exitcode.Findings
	ExitUsage    = exitcode.Usage
	ExitTimeout  = exitcode.Timeout
)

// ExitError carries an exit code up to main.
type ExitError = exitcode.Error

// Findings returns an ExitError with ExitFindings. A nil err means the
// findings were already printed and nothing more needs saying.
func Findings(err error) error { return &ExitError{Code: ExitFindings, Err: err} }

// ExitCode maps an error returned by a command to the process exit code.
func ExitCode(err error) int { return exitcode.Of(err) }
