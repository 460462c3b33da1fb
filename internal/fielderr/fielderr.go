// Package fielderr is the error a library returns for a bad setting or
// input, in the library's own terms ("tolerance", "job user"). A library
// cannot know whether the value came from a CLI flag, a pipeline's input
// (the GitHub Action, a GitLab component) or a Go caller, so it never names
// a --flag; the command layer renames the field with its own table (Names)
// to the flag or input the user actually typed.
package fielderr

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Error is a bad value for one field.
type Error struct {
	// Field is the library's name of the setting; it is also the key of
	// the command layer's Names.
	Field string
	// Value is the value as given, quoted in the message; empty when
	// the value was missing or is a secret.
	Value string
	// Problem says what is wrong and how to fix it. It may name other
	// fields as {field}, so they are renamed with Field. It follows the
	// field after ": ", or after a space when it goes on the sentence
	// ("is required", "and {other} exclude each other").
	Problem string
	// Err is the cause, if any.
	Err error
}

// New returns an *Error for field with the problem formatted from format
// and args (which must not hold secrets). A %w in format sets Err.
func New(field, value, format string, args ...any) *Error {
	e := fmt.Errorf(format, args...)
	return &Error{Field: field, Value: value, Problem: e.Error(), Err: errors.Unwrap(e)}
}

func (e *Error) Error() string { return e.render(nil) }

func (e *Error) Unwrap() error { return e.Err }

var ref = regexp.MustCompile(`\{([A-Za-z][A-Za-z0-9 ()_-]*)\}`)

func (e *Error) render(names Names) string {
	name := func(f string) string {
		if n, ok := names[f]; ok {
			return n
		}
		return f
	}
	var b strings.Builder
	b.WriteString(name(e.Field))
	if e.Value != "" {
		fmt.Fprintf(&b, " %q", e.Value)
	}
	if e.Problem != "" {
		sep := ": "
		if strings.HasPrefix(e.Problem, "is ") || strings.HasPrefix(e.Problem, "and ") {
			sep = " "
		}
		b.WriteString(sep)
		b.WriteString(ref.ReplaceAllStringFunc(e.Problem, func(m string) string { return name(m[1 : len(m)-1]) }))
	}
	if e.Err != nil && !strings.Contains(e.Problem, e.Err.Error()) {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Names maps a library field to what the user typed for it, one table
// per command: "--tolerance" for the CLI ("--tolerance (GPUPASS_TOLERANCE,
// the tolerance input)" for gpupass under -o github|gitlab).
type Names map[string]string

// Apply returns err with the first *Error in its chain renamed by n, the
// text around it kept; errors.Is and errors.As still see the chain. An
// error renamed once is left as it is, so the innermost command's table
// wins (a command's own over the root's).
func (n Names) Apply(err error) error {
	var fe *Error
	if err == nil || !errors.As(err, &fe) {
		return err
	}
	var done *named
	if errors.As(err, &done) {
		return err
	}
	old, renamed := fe.Error(), fe.render(n)
	if old == renamed {
		return err
	}
	return &named{msg: strings.Replace(err.Error(), old, renamed, 1), err: err}
}

type named struct {
	msg string
	err error
}

func (e *named) Error() string { return e.msg }
func (e *named) Unwrap() error { return e.err }
