package api

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// TrustCA returns a TLS client configuration that trusts the system roots
// plus the PEM certificates in caFile (--tls-ca: a private CA, or a
// self-signed broker's own certificate); nil (system roots only) when
// caFile is empty.
func TrustCA(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fielderr.New(FieldCA, caFile, "%w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fielderr.New(FieldCA, caFile, "no PEM certificate in it")
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// FieldCA is the field of TrustCA's errors (*fielderr.Error): a PEM
// file of extra CAs to trust for an https broker URL.
const FieldCA = "broker CA file"

// UntrustedCertError is returned (inside the RPC error) when the broker's
// TLS certificate does not verify. Retrying cannot fix it: a client stops
// at once and says how to make the certificate trusted.
type UntrustedCertError struct{ Err error }

func (e *UntrustedCertError) Error() string {
	return fmt.Sprintf("the broker's TLS certificate is not trusted (%v); %s", e.Err, e.fix())
}

// fix is how to trust the certificate, as a field error so that the
// command layer names its flag for the CA file (it is in Unwrap's tree).
func (e *UntrustedCertError) fix() *fielderr.Error {
	return &fielderr.Error{Field: FieldCA, Problem: "is how to trust it: the PEM certificate of the CA " +
		"that signed it (the broker's own certificate if it is self-signed); or add that CA to the system trust store " +
		"(Debian: copy it to /usr/local/share/ca-certificates/ and run update-ca-certificates)"}
}

func (e *UntrustedCertError) Unwrap() []error { return []error{e.Err, e.fix()} }

// UntrustedCert returns the certificate verification failure inside err,
// if that is what err is.
func UntrustedCert(err error) (*UntrustedCertError, bool) {
	if err == nil {
		return nil, false
	}
	var u *UntrustedCertError
	if errors.As(err, &u) {
		return u, true
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &hostname) {
		return &UntrustedCertError{Err: rootCause(err)}, true
	}
	return nil, false
}

// rootCause is the innermost error: the x509 reason, without the RPC and
// URL wrapping the caller adds anyway.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
