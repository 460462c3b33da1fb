package broker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/spec"
)

// TestSubmitSpecJSONIsTheSpec submits a spec as the CLI does (its
// canonical JSON beside the file as written) and as a token holder
// could to split what runs from what the audit shows: the canonical
// bytes are stored, assigned and fingerprinted as sent, the file as
// written is kept for the audit, and a file of another spec, bytes that
// are not the canonical JSON, or an oversized spec_json are refused
// naming the field. The file alone (an older CLI) still works.
func TestSubmitSpecJSONIsTheSpec(t *testing.T) {
	t.Parallel()
	file := specYAML(t)
	canon := func(yml []byte) []byte {
		t.Helper()
		_, js, err := spec.EncodeFile("gpupass.yaml", yml)
		if err != nil || js == nil {
			t.Fatalf("encoding the test spec: %v", err)
		}
		return js
	}
	sent := canon(file)
	// The same spec in another spelling: encoding/json's struct order,
	// which Decode reads (brokers of the previous release stored it).
	sp, err := spec.Decode(sent)
	if err != nil {
		t.Fatal(err)
	}
	structOrder, err := json.Marshal(sp)
	if err != nil {
		t.Fatal(err)
	}
	// Another spec: what the run would really run while the audit shows
	// the file.
	other := canon([]byte(strings.Replace(string(file), "transformers==4.38.2", "transformers==4.37.0", 1)))
	// A spec gpupass validate refuses (no exact CUDA version), in its
	// canonical JSON: sent alone it skipped the file's rules.
	loose, err := spec.Decode(sent)
	if err != nil {
		t.Fatal(err)
	}
	loose.Runtime.CUDA = "12"
	invalid, err := spec.Encode(loose)
	if err != nil {
		t.Fatal(err)
	}

	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))

			refusals := []struct {
				name      string
				yml, js   []byte
				field     string
				wantInErr string
			}{
				{"a spec_yaml of another spec", file, other, api.FieldSubmitSpecYAML, "spec_yaml and spec_json are different specs"},
				{"spec_json not canonical", nil, structOrder, api.FieldSubmitSpecJSON, "spec_json is not the spec's canonical JSON"},
				{"spec_json not canonical beside its file", file, structOrder, api.FieldSubmitSpecJSON, "spec_json is not the spec's canonical JSON"},
				{"spec_json over the size cap", file, append(bytes.Clone(sent), bytes.Repeat([]byte(" "), spec.MaxSize)...), api.FieldSubmitSpecJSON, "spec_json is 1"},
				{"spec_json with a key this broker does not know", nil, []byte(`{"name":"x","smuggled":true}`), api.FieldSubmitSpecJSON, "unknown field"},
				{"spec_json alone of a spec gpupass validate refuses", nil, invalid, api.FieldSubmitSpecJSON, "spec_json is not a valid spec (1 errors): 1:"},
			}
			for _, r := range refusals {
				resp, err := c.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: r.yml, SpecJson: r.js,
					Region: "us-west-2", Command: []string{"python3", "train.py"}}))
				if err == nil {
					run := resp.Msg.Run
					a, _ := b.Store.(store.Runs).Alloc(ctx, run.Id)
					t.Errorf("%s: accepted: run %s stored fingerprint %s, spec_json %d bytes, spec_yaml %d bytes; want refused",
						r.name, run.Id, run.SpecFingerprint, len(a.SpecJSON), len(a.SpecYAML))
					continue
				}
				fe := api.FieldErrorOf(err)
				if connect.CodeOf(err) != connect.CodeInvalidArgument || fe == nil || fe.Field != r.field || !strings.Contains(err.Error(), r.wantInErr) {
					t.Errorf("%s: err = %v (field %v); want invalid_argument on %s saying %q", r.name, err, fe, r.field, r.wantInErr)
				}
			}
			// A dry run of it is refused the same way, naming the rule.
			_, err := b.Clients(t, b.Token(t, store.RoleRead, "*")).Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecJson{SpecJson: invalid}}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "cuda.exact-version") {
				t.Errorf("dry run of a spec_json gpupass validate refuses: %v; want invalid_argument naming cuda.exact-version", err)
			}

			accepted := []struct {
				name    string
				yml, js []byte
			}{
				{"the CLI's canonical JSON with the file as written", file, sent},
				{"the canonical JSON alone", nil, sent},
				{"the file alone, as an older CLI sends it", file, nil},
			}
			for _, r := range accepted {
				resp, err := c.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: r.yml, SpecJson: r.js,
					Region: "us-west-2", Command: []string{"python3", "train.py"}}))
				if err != nil {
					t.Errorf("%s: %v", r.name, err)
					continue
				}
				run := resp.Msg.Run
				a, err := b.Store.(store.Runs).Alloc(ctx, run.Id)
				if err != nil {
					t.Fatal(err)
				}
				dec, err := spec.Decode(sent)
				if err != nil {
					t.Fatal(err)
				}
				fp, err := spec.Fingerprint(dec)
				if err != nil {
					t.Fatal(err)
				}
				if run.SpecFingerprint != fp || a.SpecFingerprint != fp || !bytes.Equal(a.SpecJSON, sent) || !bytes.Equal(a.SpecYAML, r.yml) {
					t.Errorf("%s: stored fingerprint %s (run %s), spec_json %q, spec_yaml %q; want %s of the bytes sent, those bytes, the file as sent",
						r.name, a.SpecFingerprint, run.SpecFingerprint, a.SpecJSON, a.SpecYAML, fp)
				}
			}
		})
	}
}
