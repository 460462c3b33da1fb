package ghactions

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCommand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cmd     string
		props   map[string]string
		message string
		want    string
	}{
		{"mask", "add-mask", nil, "s3cret", "::add-mask::s3cret\n"},
		{"data escaped", "add-mask", nil, "pa%0As%25s\rw\nx", "::add-mask::pa%250As%2525s%0Dw%0Ax\n"},
		{"properties sorted and escaped", "error", map[string]string{"title": "a:b,c", "file": "x.yaml", "line": "3"},
			"bad\nvalue", "::error file=x.yaml,line=3,title=a%3Ab%2Cc::bad%0Avalue\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := Command(&b, tt.cmd, tt.props, tt.message); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, b.String()); diff != "" {
				t.Errorf("command (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSetOutputCannotBeEndedEarly: a value that holds a delimiter line
// (go-githubactions' fixed one, or a heredoc-looking line) stays one
// value: the delimiter is random per output.
func TestSetOutputCannotBeEndedEarly(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "output")
	value := "a\n_GitHubActionsFileCommandDelimeter_\nverdict=consistent\nEOF"
	if err := SetOutput(path, "report-path", value); err != nil {
		t.Fatal(err)
	}
	if err := SetOutput(path, "verdict", "diverged"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := parseOutputs(t, string(b))
	want := map[string]string{"report-path": value, "verdict": "diverged"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outputs as the runner reads them (-want +got):\n%s", diff)
	}
}

// parseOutputs reads a GITHUB_OUTPUT file as the runner does: name=value
// lines and name<<DELIM heredocs.
func parseOutputs(t *testing.T, s string) map[string]string {
	t.Helper()
	out := map[string]string{}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	heredoc := regexp.MustCompile(`^([a-z-]+)<<(.+)$`)
	for i := 0; i < len(lines); i++ {
		m := heredoc.FindStringSubmatch(lines[i])
		if m == nil {
			k, v, _ := strings.Cut(lines[i], "=")
			out[k] = v
			continue
		}
		var body []string
		for i++; i < len(lines) && lines[i] != m[2]; i++ {
			body = append(body, lines[i])
		}
		out[m[1]] = strings.Join(body, "\n")
	}
	return out
}
