// Package exitcode holds the exit codes every gpupass binary shares and the
// error type that carries one up to main. It imports nothing of the
// command layer, so the broker and the agent use it without linking the
// CLI (cosign, forge clients, table rendering).
package exitcode

import (
	"errors"
	"fmt"
)

// Exit codes of every gpupass command. They are part of the CLI contract:
// pipelines branch on them, so never renumber.
const (
	// OK: the command did what was asked and found nothing wrong.
	OK = 0
	// Findings: the command ran and found problems (spec findings,
	// runtime mismatches, divergence past tolerance, failed verification,
	// a failed run).
	Findings = 1
	// Usage: bad flags or arguments, unreadable input, or an I/O error
	// that kept the command from running at all.
	Usage = 2
	// Timeout: `gpupass wait --timeout` ran out while runs were still
	// going; they keep running, and the same wait picks them up again.
	Timeout = 3
)

// Error carries an exit code up to main. Commands return it when the
// code is not the default for a plain error (Usage).
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Of maps an error returned by a command to the process exit code.
func Of(err error) int {
	if err == nil {
		return OK
	}
	var ee *Error
	if errors.As(err, &ee) {
		return ee.Code
	}
	return Usage
}
