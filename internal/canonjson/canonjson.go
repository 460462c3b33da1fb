// Package canonjson produces canonical JSON per RFC 8785, the JSON
// Canonicalization Scheme (JCS): object keys sorted by their UTF-16 code
// units, no insignificant whitespace, numbers in ECMAScript's shortest
// form (4.50 -> 4.5, 1E30 -> 1e+30), strings with only the escapes the
// RFC requires (U+2028 and "<" as themselves). The same value always
// encodes to the same bytes, so hashes and signatures over it are stable.
// It is the one canonical encoder of gpupass: signed conformance reports
// and the spec fingerprint both go through it. The RFC work itself is
// github.com/gowebpki/jcs (a port of the RFC authors' reference code).
package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gowebpki/jcs"
)

// Marshal encodes v canonically. v is first encoded with encoding/json
// (struct tags apply), so struct field order cannot leak into the bytes.
// An integer that a double cannot hold exactly is an error rather than a
// silently rounded signature: encode such values as strings.
func Marshal(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return Transform(raw)
}

// Transform canonicalises JSON text (RFC 8785), with the same integer
// rule as Marshal.
func Transform(raw []byte) ([]byte, error) {
	if err := exactIntegers(raw); err != nil {
		return nil, err
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return out, nil
}

// exactIntegers fails on an integer literal that is not exactly the
// double JCS would write for it: 9007199254740993 (a Go int64 beyond 2^53)
// would be signed as 9007199254740992. Literals that are already the
// shortest form of a double (2^68 written 295147905179352830000, as
// encoding/json writes a float64) pass. Fractions and exponents are
// doubles by nature; RFC 8785 rounds them (4.50 -> 4.5).
func exactIntegers(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("canonical json: %w", err)
		}
		n, ok := tok.(json.Number)
		if !ok || strings.ContainsAny(string(n), ".eE") {
			continue
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil || strconv.FormatFloat(f, 'f', -1, 64) != string(n) {
			return fmt.Errorf("canonical json: integer %s is not exactly an IEEE 754 double (beyond 2^53) and would change as an RFC 8785 number; encode it as a string", n)
		}
	}
}
