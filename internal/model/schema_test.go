package model_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/gpupass/gpupass/internal/model"
	"github.com/gpupass/gpupass/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite the example in docs/model-provenance.md")

// schema compiles docs/model-provenance.schema.json.
func schema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	path := filepath.Join(testutil.RepoRoot(t), "docs", "model-provenance.schema.json")
	c := jsonschema.NewCompiler()
	s, err := c.Compile(path)
	if err != nil {
		t.Fatalf("compiling %s: %v", path, err)
	}
	return s
}

// validate checks the predicate as the code encodes it against the
// schema.
func validate(t *testing.T, s *jsonschema.Schema, p model.Predicate) error {
	t.Helper()
	st, err := model.NewStatement("reg.example/team/model", strings.Repeat("c", 64), p).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Predicate json.RawMessage `json:"predicate"`
	}
	if err := json.Unmarshal(st, &doc); err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc.Predicate))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(v)
}

// docExample is the statement docs/model-provenance.md shows.
func docExample() model.Statement {
	return model.NewStatement("registry.example.com/team/model", "5b0c0d6c56e2c1c7e6d0f9d6b1c3f1e9a2d7e4b8c0a1f3e5d7c9b1a3e5f7d9c1", model.Predicate{
		SpecFingerprint: "sha256:4e17d83a99f984962f1a9d15b1f774c770b895be5aa8f9c75092bb75f28f98a8",
		Run:             model.Run{ID: "alloc-dd93f2a5", Group: "group-2f6c1a90", Region: "us-west-2", State: "succeeded"},
		Nodes: []model.Node{{
			NodeID: "agt-ebb68cfd2ae59dec", RunReportSHA256: "9f2b7c1e0d4a6b8c3e5f7a9b1c3d5e7f9a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d",
			AgentKeySHA256: "1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f", RuntimeFingerprint: "sha256:4e17d83a99f984962f1a9d15b1f774c770b895be5aa8f9c75092bb75f28f98a8",
		}},
		Commit:  &model.Commit{SHA: "0c5a7e9b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c", Repository: "acme/llm", Source: "ci"},
		Metrics: &model.Metrics{LastStep: 30, Values: map[string]float64{"loss": 0.0412, "lr": 0.001}},
		Audit:   &model.File{Name: "audit-report.zip", SHA256: "7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e1b3d5f7a9c", Size: 48213},
		Model: model.Model{File: model.File{Name: "ckpt-00000030.pt", SHA256: "e9575719dea9fc26b4ae1a2cc8b2d7a58a57d73664c2cf27a70c23d0cca59690", Size: 17582},
			Source: model.SourceCheckpoint},
		Simulated:      false,
		GpupassVersion: "v0.9.0",
	})
}

// The predicate the code writes validates against the published schema,
// with and without its optional parts, and what the schema forbids is
// refused (so it checks something).
func TestPredicateMatchesSchema(t *testing.T) {
	t.Parallel()
	s := schema(t)
	full := docExample().Predicate
	minimal := model.Predicate{SpecFingerprint: full.SpecFingerprint, Run: model.Run{ID: "alloc-1", State: "failed"},
		Model: model.Model{File: model.File{Name: "m.safetensors", SHA256: strings.Repeat("a", 64), Size: 1}, Source: model.SourceFile}}
	for name, p := range map[string]model.Predicate{"full": full, "minimal": minimal, "unit test's": pred} {
		if p.Model.Name == "" {
			p.Model = minimal.Model
		}
		if err := validate(t, s, p); err != nil {
			t.Errorf("%s predicate does not validate: %v", name, err)
		}
	}
	bad := full
	bad.Model.SHA256 = "sha256:" + full.Model.SHA256
	if err := validate(t, s, bad); err == nil {
		t.Error("a model digest with its algorithm prefix validates; the schema says hex")
	}
	bad = full
	bad.Model.Source = "elsewhere"
	if err := validate(t, s, bad); err == nil {
		t.Error("an unknown model source validates")
	}
}

// The example in docs/model-provenance.md is what the code writes for it,
// byte for byte.
func TestDocsExampleIsWhatCodeWrites(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "docs", "model-provenance.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- example statement -->\n```json\n(.*?)```").FindSubmatchIndex(b)
	if m == nil {
		t.Fatal("docs/model-provenance.md has no example statement block (<!-- example statement --> then ```json)")
	}
	var want bytes.Buffer
	enc := json.NewEncoder(&want)
	enc.SetIndent("", "  ")
	if err := enc.Encode(docExample()); err != nil {
		t.Fatal(err)
	}
	if *update {
		path := filepath.Join(testutil.RepoRoot(t), "docs", "model-provenance.md")
		out := append(append(append([]byte{}, b[:m[2]]...), want.Bytes()...), b[m[3]:]...)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(want.String(), string(b[m[2]:m[3]])); diff != "" {
		t.Errorf("the docs' example differs from what the code writes (-code +docs; go test -run TestDocsExampleIsWhatCodeWrites -update rewrites it):\n%s", diff)
	}
	if err := validate(t, schema(t), docExample().Predicate); err != nil {
		t.Errorf("the docs' example does not validate: %v", err)
	}
}
