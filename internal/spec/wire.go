package spec

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/gpupass/gpupass/internal/canonjson"
)

// Encode is the one form a parsed spec travels and is kept in between
// the broker and its agents (a run's stored spec, the assignment an
// agent takes): the canonical JSON (RFC 8785, internal/canonjson, the
// encoder Canonical uses) of the whole Spec. The fingerprint hashes only
// the environment part (Canonical); the agent also needs the resources,
// the metrics pattern and the bundle reference, so the whole spec
// travels, and the fingerprint travels beside it to be checked again
// (Assignment.spec_fingerprint).
func Encode(s *Spec) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("encoding a nil spec")
	}
	return canonjson.Marshal(s)
}

// Decode reads a spec Encode wrote, or the encoding/json form of a Spec
// that brokers of the previous release stored and sent (the same keys in struct
// order). It reads JSON only: nothing on this path is YAML, and a key
// this version does not know is an error rather than a spec setting
// silently dropped.
func Decode(b []byte) (*Spec, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("decoding the spec (JSON): %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("decoding the spec (JSON): data after the spec")
	}
	return &s, nil
}

// EncodeFile is a spec file in the form it travels: Validate's result
// for data (the content of file) and, when the spec is valid, Encode of
// it. A client sends these bytes as SubmitRequest.spec_json beside the
// file as written; the broker computes them from spec_yaml the same way,
// so both ends agree byte for byte. json is nil when the spec is not
// valid (res says why).
func EncodeFile(file string, data []byte) (res *Result, json []byte, err error) {
	res = Validate(file, data)
	if !res.Valid {
		return res, nil, nil
	}
	json, err = Encode(res.Spec)
	return res, json, err
}
