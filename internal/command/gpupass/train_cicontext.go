package gpupass

import (
	"log/slog"
	"strconv"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/ci"
	ghforge "github.com/gpupass/gpupass/internal/forge/github"
	glforge "github.com/gpupass/gpupass/internal/forge/gitlab"
)

// trainCIContext is the CI job train submits from, as the forge posters
// read it (ghforge.FromEnv, glforge.FromEnv) and the report links it
// (ciLinks): the broker keeps it with the run group and sends it in the
// group's webhook event, so the workflow that event starts comments on
// this job's pull or merge request. nil outside GitHub Actions and
// GitLab CI, or when the job's variables do not make a valid one (then
// the runs go without it: the event's receiver falls back to its own).
func trainCIContext(kind ci.Kind, getenv func(string) string, log *slog.Logger) *gpupassv1.CIContext {
	var c *gpupassv1.CIContext
	switch kind {
	case ci.GitHub:
		tgt, run, _, err := ghforge.FromEnv(getenv)
		if err != nil {
			log.Warn("the run group goes without its CI context", "err", err)
			return nil
		}
		if tgt.Owner == "" || tgt.Repo == "" {
			return nil
		}
		c = &gpupassv1.CIContext{Forge: api.CIForgeGitHub, Repository: tgt.Owner + "/" + tgt.Repo, PullRequest: int64(tgt.Number), Sha: run.SHA}
	case ci.GitLab:
		tgt, run, _, err := glforge.FromEnv(getenv)
		if err != nil {
			log.Warn("the run group goes without its CI context", "err", err)
			return nil
		}
		path := getenv("CI_MERGE_REQUEST_PROJECT_PATH")
		if path == "" {
			path = getenv("CI_PROJECT_PATH")
		}
		if path == "" {
			return nil
		}
		c = &gpupassv1.CIContext{Forge: api.CIForgeGitLab, Repository: path, PullRequest: tgt.IID, Sha: run.SHA}
		if _, err := strconv.ParseUint(tgt.Project, 10, 64); err == nil {
			c.ProjectId = tgt.Project
		}
	default:
		return nil
	}
	if links := ciLinks(kind, getenv, ""); len(links) > 0 {
		c.RunUrl = links[0].URL // the run, or the pipeline
	}
	if err := api.CheckCIContext(c); err != nil {
		log.Warn("the run group goes without its CI context", "err", err)
		return nil
	}
	return c
}
