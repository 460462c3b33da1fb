package api

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// FieldSubmitCI is the Submit request's CI context (SubmitRequest.ci).
const FieldSubmitCI = "ci"

// The CI context's forges.
const (
	CIForgeGitHub = "github"
	CIForgeGitLab = "gitlab"
)

// Bounds of a CI context: every field is something a forge's CI sets, and
// the whole is copied into each webhook event of its group, so each is
// small and of a known form.
const (
	maxCIRepository = 255
	maxCIRunURL     = 512
	maxCIPull       = 1<<31 - 1
)

var (
	// ciRepoForm: GitHub OWNER/REPO, GitLab group/subgroup…/project.
	ciRepoForm    = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+){1,20}$`)
	ciSHAForm     = regexp.MustCompile(`^[0-9a-f]{7,64}$`)
	ciProjectForm = regexp.MustCompile(`^[0-9]{1,20}$`)
)

// CheckCIContext checks a run group's CI context as the broker stores it
// and sends it in webhook events, where receivers and the workflows they
// start read it (a PR number, a repository): every field has the form its
// forge gives it, so none can carry anything else (shell or YAML text, a
// URL with credentials). The error names the field in the wire's terms
// (ci.repository…).
func CheckCIContext(c *gpupassv1.CIContext) error {
	if c == nil {
		return nil
	}
	switch c.Forge {
	case CIForgeGitHub, CIForgeGitLab:
	default:
		return fmt.Errorf("ci.forge %q: must be %s or %s", trimForError(c.Forge), CIForgeGitHub, CIForgeGitLab)
	}
	if len(c.Repository) > maxCIRepository || !ciRepoForm.MatchString(c.Repository) || strings.Contains(c.Repository, "..") {
		return fmt.Errorf("ci.repository %q: must be OWNER/REPO (GitHub) or the project's path (GitLab), at most %d characters", trimForError(c.Repository), maxCIRepository)
	}
	if c.PullRequest < 0 || c.PullRequest > maxCIPull {
		return fmt.Errorf("ci.pull_request %d: must be a pull or merge request number, or 0 for none", c.PullRequest)
	}
	if c.Sha != "" && !ciSHAForm.MatchString(c.Sha) {
		return fmt.Errorf("ci.sha %q: must be a commit id (7 to 64 lowercase hex digits)", trimForError(c.Sha))
	}
	if c.RunUrl != "" {
		u, err := url.Parse(c.RunUrl)
		if err != nil || len(c.RunUrl) > maxCIRunURL || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil ||
			strings.ContainsFunc(c.RunUrl, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return fmt.Errorf("ci.run_url %q: must be an http(s) URL of at most %d characters, without credentials or spaces", trimForError(c.RunUrl), maxCIRunURL)
		}
	}
	if c.ProjectId != "" && (c.Forge != CIForgeGitLab || !ciProjectForm.MatchString(c.ProjectId)) {
		return fmt.Errorf("ci.project_id %q: must be a GitLab project's numeric id, on gitlab only", trimForError(c.ProjectId))
	}
	return nil
}

// trimForError keeps a refused value short and printable in an error.
func trimForError(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
