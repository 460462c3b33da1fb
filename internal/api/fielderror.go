package api

import (
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// Request fields a client renames to what its user typed (a --flag, a
// pipeline's input); a server names these, never a client's flags.
const (
	FieldSubmitCommand   = "command"
	FieldSubmitName      = "name"
	FieldSubmitWorkdir   = "workdir_archive"
	FieldSubmitTimeLimit = "time_limit_seconds"
	FieldSubmitGroup     = "group"
	FieldSubmitGroupSize = "group_size"
	// FieldSubmitQueueTimeout is train's --queue-timeout.
	FieldSubmitQueueTimeout = "queue_timeout_seconds"
	// FieldSubmitSpecYAML and FieldSubmitSpecJSON are the spec as written
	// and its canonical JSON; the CLI computes both from --spec itself.
	FieldSubmitSpecYAML = "spec_yaml"
	FieldSubmitSpecJSON = "spec_json"
)

// FieldError is a refusal of one request field as a connect error: its
// message is fe in the wire's terms, and a google.rpc.BadRequest detail
// carries the field and problem, so FieldErrorOf gives a client the
// *fielderr.Error back to rename with its own fielderr.Names. fe's Problem
// must hold its cause's text (fielderr.New with %w does) and fe no Value:
// the detail carries neither.
func FieldError(code connect.Code, fe *fielderr.Error) *connect.Error {
	ce := connect.NewError(code, fe)
	d, err := connect.NewErrorDetail(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: fe.Field, Description: fe.Problem},
	}})
	if err == nil {
		ce.AddDetail(d)
	}
	return ce
}

// FieldErrorOf returns the field a server refused with FieldError, as a
// *fielderr.Error whose text is the one in the server's message, or nil.
func FieldErrorOf(err error) *fielderr.Error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		br, ok := v.(*errdetails.BadRequest)
		if !ok || len(br.GetFieldViolations()) != 1 {
			continue
		}
		fv := br.GetFieldViolations()[0]
		fe := &fielderr.Error{Field: fv.GetField(), Problem: fv.GetDescription()}
		if fe.Error() != ce.Message() {
			return nil // not FieldError's shape: renaming would not find the text
		}
		return fe
	}
	return nil
}
