// Package brokerrpc words the broker's ConnectRPC errors for the use
// cases and the commands: what was being done, at which URL, and what to
// do when no broker answers. It names no flag; the command layer adds
// those (see NoBrokerError).
package brokerrpc

import (
	"fmt"
	"strings"

	"github.com/gpupass/gpupass/internal/api"
)

// Error wraps a broker call's error: what is the action ("submitting the
// run in us-west"), url the broker's. The call's error stays in the chain
// (errors.As finds a *fielderr.Error, the broker's refused request field
// included, or the untrusted certificate in it).
func Error(what, url string, err error) error {
	if api.NoAnswer(err) {
		return &NoBrokerError{What: what, URL: url, Detail: strings.TrimPrefix(api.Describe(err), "no answer: "), Err: err}
	}
	d := &describedError{msg: fmt.Sprintf("%s at %s: %s", what, url, api.Describe(err)), errs: []error{err}}
	if u, ok := api.UntrustedCert(err); ok {
		d.errs = append(d.errs, u) // Describe made it: how to trust the broker
	}
	if fe := api.FieldErrorOf(err); fe != nil {
		// The broker names its request field; the command layer's
		// fielderr.Names renames it to the flag or input the user typed.
		d.errs = append(d.errs, fe)
	}
	return d
}

// NoBrokerError says no broker answered at URL, and how to get one.
type NoBrokerError struct {
	What, URL, Detail string
	Err               error
}

func (e *NoBrokerError) Error() string {
	return fmt.Sprintf("%s at %s: no broker answers there (%s): start one with `gpupass up` (a local broker and agent) or `gpupass-broker serve`, or give the URL of a running one", e.What, e.URL, e.Detail)
}

func (e *NoBrokerError) Unwrap() error { return e.Err }

// describedError is api.Describe's wording with err kept in the chain.
type describedError struct {
	msg  string
	errs []error
}

func (e *describedError) Error() string   { return e.msg }
func (e *describedError) Unwrap() []error { return e.errs }
