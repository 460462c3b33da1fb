package modelprov

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/model"
)

// The commit comes from --commit, else from the CI job that pushes; a
// variable of another CI (or of none) is not taken for it.
func TestCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		flag string
		env  map[string]string
		want *model.Commit
	}{
		{name: "none"},
		{name: "flag wins", flag: "abc", env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_SHA": "def"}, want: &model.Commit{SHA: "abc", Source: "flag"}},
		{name: "github", env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_SHA": "def", "GITHUB_REPOSITORY": "acme/llm"}, want: &model.Commit{SHA: "def", Repository: "acme/llm", Source: "ci"}},
		{name: "gitlab", env: map[string]string{"GITLAB_CI": "true", "CI_COMMIT_SHA": "fed", "CI_PROJECT_PATH": "acme/llm"}, want: &model.Commit{SHA: "fed", Repository: "acme/llm", Source: "ci"}},
		{name: "a stray GITHUB_SHA outside Actions", env: map[string]string{"GITHUB_SHA": "def"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := commit(tc.flag, func(k string) string { return tc.env[k] })
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("commit (-want +got):\n%s", diff)
			}
		})
	}
}

// --audit must be an audit report, and of this run.
func TestAuditFileIsOfTheRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notZip := filepath.Join(dir, "notes.zip")
	if err := os.WriteFile(notZip, []byte("not a zip"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := auditFile(context.Background(), notZip, "alloc-1")
	if err == nil || !strings.Contains(err.Error(), "is not an audit report") || !strings.Contains(err.Error(), "gpupass audit alloc-1") {
		t.Errorf("auditFile(not a zip) = %v, want it refused saying how to make one", err)
	}
	_, err = auditFile(context.Background(), filepath.Join(dir, "missing.zip"), "alloc-1")
	if err == nil || !strings.Contains(err.Error(), FieldAudit) {
		t.Errorf("auditFile(missing) = %v, want an error naming %s", err, FieldAudit)
	}
}
