package cli

import (
	"errors"
	"fmt"
)

// Exit codes of every gpupass command. They are part of the CLI contract:
// pipelines branch on them, so never renumber.
const (
	// ExitOK: the command did what was asked and found nothing wrong.
	ExitOK = 0
	// ExitFindings: the command ran and found problems (spec findings,
	// runtime mismatches, divergence past tolerance, failed verification,
	// a failed run).
	ExitFindings = 1
	// ExitUsage: bad flags or arguments, unreadable input, or an I/O error
	// that kept the command from running at all.
	ExitUsage = 2
)

// ExitError carries an exit code up to main. Commands return it when the
// code is not the default for a plain error (ExitUsage).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Findings returns an ExitError with ExitFindings. A nil err means the
// findings were already printed and nothing more needs saying.
func Findings(err error) error { return &ExitError{Code: ExitFindings, Err: err} }

// ExitCode maps an error returned by a command to the process exit code.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return ExitUsage
}
