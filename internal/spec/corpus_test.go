package spec

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// corpusSpecs lists testdata/specs/*.yaml. Each file's first line says
// which rule ids its findings must carry: `# expect: rule rule ...`, or
// `# expect: (valid)`; empty.yaml has no room for a header.
func corpusSpecs(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "specs", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 30 {
		t.Fatalf("corpus has %d specs, want at least 30", len(files))
	}
	return files
}

func expectedRules(t *testing.T, name string, data []byte) []string {
	t.Helper()
	if filepath.Base(name) == "empty.yaml" {
		return []string{"yaml.empty"}
	}
	first, _, _ := strings.Cut(string(data), "\n")
	want, ok := strings.CutPrefix(first, "# expect:")
	if !ok {
		t.Fatalf("%s: first line must be `# expect: ...`", name)
	}
	want = strings.TrimSpace(want)
	if want == "(valid)" {
		return []string{}
	}
	rules := strings.Fields(want)
	slices.Sort(rules)
	return rules
}

func TestCorpus(t *testing.T) {
	t.Parallel()
	for _, file := range corpusSpecs(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			res := Validate(file, data)
			got := []string{}
			for _, f := range res.Findings {
				got = append(got, f.Rule)
				if f.Line < 1 || f.Column < 1 {
					t.Errorf("finding %s has no position: %+v", f.Rule, f)
				}
				if f.File != file || f.Message == "" {
					t.Errorf("finding lacks file or message: %+v", f)
				}
				if !slices.ContainsFunc(Rules, func(r Rule) bool { return r.ID == f.Rule }) {
					t.Errorf("rule %q is not in the Rules catalogue", f.Rule)
				}
			}
			slices.Sort(got)
			want := expectedRules(t, file, data)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rules (-want +got):\n%s\nfindings: %+v", diff, res.Findings)
			}
			errs, _ := Counts(res.Findings)
			if res.Valid != (errs == 0) {
				t.Errorf("Valid = %v with %d errors", res.Valid, errs)
			}
			if res.Valid != (res.Fingerprint != "") {
				t.Errorf("Valid = %v but fingerprint %q", res.Valid, res.Fingerprint)
			}
		})
	}
}

// TestFindingPositions pins a few findings to their exact line and column,
// which the corpus test only checks for presence.
func TestFindingPositions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, file, rule string
		line, col        int
	}{
		{"ambiguous cuda points at the value", "cuda-ambiguous.yaml", "cuda.exact-version", 4, 9},
		{"typo points at the key", "unknown-keys.yaml", "yaml.unknown-key", 3, 1},
		{"duplicate points at the second key", "duplicate-keys.yaml", "yaml.duplicate-key", 8, 3},
		{"tab column", "tabs.yaml", "yaml.syntax", 4, 1},
		{"count: eight", "wrong-types.yaml", "yaml.type", 14, 10},
		{"bundle rule at no-internet-access", "bundle-required.yaml", "bundle.required", 10, 23},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join("testdata", "specs", tt.file)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var got []Position
			for _, f := range Validate(path, data).Findings {
				if f.Rule == tt.rule {
					got = append(got, Position{f.Line, f.Column})
				}
			}
			if !slices.Contains(got, Position{tt.line, tt.col}) {
				t.Errorf("%s findings at %v, want one at %d:%d", tt.rule, got, tt.line, tt.col)
			}
		})
	}
}
