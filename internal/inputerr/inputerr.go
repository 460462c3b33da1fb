// Package inputerr is the error a use case returns for a bad option. It
// names the option by its field in the use case's options struct, the
// library's own term; the command layer that filled the field renames it
// to what the user typed (a CLI flag, a `ci step` input), so one message
// reads right through either door.
package inputerr

import (
	"errors"
	"fmt"
)

// Error is an invalid option value.
type Error struct {
	// Field is the option's name in the use case (e.g. "Runs", "Prices").
	Field string
	// Value is the offending value as the user gave it; empty for a
	// missing option.
	Value string
	Err   error
	// Missing says the option was required and not given; Err says
	// what it is for.
	Missing bool
}

func (e *Error) Error() string {
	if e.Missing {
		return fmt.Sprintf("%s is required: %v", e.Field, e.Err)
	}
	if e.Value == "" {
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("%s %q: %v", e.Field, e.Value, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an *Error for field and value with a formatted problem.
func New(field, value, format string, args ...any) error {
	return &Error{Field: field, Value: value, Err: fmt.Errorf(format, args...)}
}

// Missing returns an *Error for a required field left empty; what says
// what the field is for.
func Missing(field, what string) error {
	return &Error{Field: field, Err: errors.New(what), Missing: true}
}

// Rename returns err with its Field replaced by names[Field] ("--label",
// "input runs"). Use cases return an *Error unwrapped, so the renamed
// error is the whole message; an error that is not one, or a field not
// in names, comes back unchanged.
func Rename(err error, names map[string]string) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	n, ok := names[e.Field]
	if !ok {
		return err
	}
	c := *e
	c.Field = n
	return &c
}
