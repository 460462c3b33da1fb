package api

import (
	"errors"
	"fmt"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// FieldInsecureHTTP is the consent to send a bearer token over plain HTTP
// to a broker that is not on this machine; the command layer names its
// flag or input (--insecure-http, GPUPASS_INSECURE_HTTP).
const FieldInsecureHTTP = "plain HTTP consent"

// PlainHTTPError is a bearer token (or an agent's proof) refused before
// it left: the broker URL is http:// and the address it would go to is
// not a loopback address. Anyone on the path could read the token and act
// as its holder; retrying cannot fix it.
type PlainHTTPError struct {
	// URL is the broker URL (list) as configured, without credentials.
	URL string
	// Host is the address or name that is not loopback.
	Host string
}

func (e *PlainHTTPError) Error() string {
	return fmt.Sprintf("refusing to send the broker token over plain HTTP to %s: %s is not a loopback address, so anyone on the network path could read the token and use it; "+
		"use an https:// broker URL (a broker with a TLS certificate), or %s", e.URL, e.Host, e.fix())
}

// fix is the consent, as a field error so that the command layer names
// its flag or input (it is in Unwrap's tree).
func (e *PlainHTTPError) fix() *fielderr.Error {
	return &fielderr.Error{Field: FieldInsecureHTTP, Problem: "is the switch to send it anyway, on a network you trust"}
}

func (e *PlainHTTPError) Unwrap() error { return e.fix() }

// PlainHTTP returns the refusal inside err, if that is what err is.
func PlainHTTP(err error) (*PlainHTTPError, bool) {
	var p *PlainHTTPError
	if err != nil && errors.As(err, &p) {
		return p, true
	}
	return nil, false
}
