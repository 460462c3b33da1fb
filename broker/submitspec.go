package broker

import (
	"bytes"
	"errors"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/spec"
)

// submitSpec reads a Submit's spec: the spec the run runs, the canonical
// JSON the run stores and its agent is assigned, and the fingerprint.
//
// spec_json, when set, is the spec, byte for byte: the bytes the CLI
// computed (spec.Encode) are the ones stored, assigned and fingerprinted,
// so they must be exactly what spec.Encode writes for the spec they hold.
// spec_yaml beside it is the file as written, kept for the audit; it must
// hold the same spec, or the audit would show one spec while the run ran
// another. spec_yaml alone (an older CLI) is parsed here as it always was.
func submitSpec(m *gpupassv1.SubmitRequest) (*spec.Spec, []byte, string, error) {
	yml, js := m.GetSpecYaml(), m.GetSpecJson()
	if len(js) == 0 {
		if len(yml) == 0 {
			return nil, nil, "", connect.NewError(connect.CodeInvalidArgument, errors.New("no spec: set spec_yaml or spec_json"))
		}
		res, js, err := spec.EncodeFile(api.FieldSubmitSpecYAML, yml)
		if !res.Valid {
			return nil, nil, "", connect.NewError(connect.CodeInvalidArgument, invalidSpecYAML(res))
		}
		if err != nil {
			return nil, nil, "", api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitSpecYAML, "", "%w", err))
		}
		return res.Spec, js, res.Fingerprint, nil
	}
	refuse := func(format string, args ...any) error {
		return api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitSpecJSON, "", format, args...))
	}
	// The cap the file has (spec.Parse refuses a larger spec_yaml), before
	// any decoding.
	if len(js) > spec.MaxSize {
		return nil, nil, "", refuse("is %d bytes; a spec is at most %d", len(js), spec.MaxSize)
	}
	sp, err := spec.Decode(js)
	if err != nil {
		return nil, nil, "", refuse("%w", err)
	}
	canon, err := spec.Encode(sp)
	if err != nil {
		return nil, nil, "", refuse("%w", err)
	}
	if !bytes.Equal(canon, js) {
		// Another spelling of the same spec would be stored and assigned
		// as sent while the fingerprint vouched for the canonical one.
		return nil, nil, "", refuse("is not the spec's canonical JSON: send the bytes internal/spec.Encode writes (RFC 8785), as gpupass train does")
	}
	fp, err := spec.Fingerprint(sp)
	if err != nil {
		return nil, nil, "", refuse("%w", err)
	}
	if len(yml) == 0 {
		if fe := specRules(js, fp); fe != nil {
			return nil, nil, "", api.FieldError(connect.CodeInvalidArgument, fe)
		}
	}
	if len(yml) > 0 {
		res, fromYAML, err := spec.EncodeFile(api.FieldSubmitSpecYAML, yml)
		if !res.Valid {
			return nil, nil, "", connect.NewError(connect.CodeInvalidArgument, invalidSpecYAML(res))
		}
		if err != nil || !bytes.Equal(fromYAML, js) {
			return nil, nil, "", api.FieldError(connect.CodeInvalidArgument, fielderr.New(api.FieldSubmitSpecYAML, "",
				"and {%s} are different specs: send the spec file as written and spec.Encode of the spec it holds", api.FieldSubmitSpecJSON))
		}
	}
	return sp, js, fp, nil
}
