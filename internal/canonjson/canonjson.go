// Package canonjson produces canonical JSON: object keys sorted, no
// insignificant whitespace, no HTML escaping (RFC 8785 style for the
// values gpupass emits: strings, integers, booleans, short decimals). The
// same value always encodes to the same bytes, so hashes and signatures
// over it are stable.
package canonjson

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Marshal encodes v canonically. v is first encoded with encoding/json
// (struct tags apply), then re-encoded through a generic tree so that
// struct field order cannot leak into the bytes.
func Marshal(v any) ([]byte, error) {
	raw, err := encode(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	out, err := encode(tree)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
