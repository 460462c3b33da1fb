// Package forgepost posts compare reports to the forges: a sticky comment
// on the GitHub pull request or GitLab merge request the pipeline runs
// for. It links go-github and GitLab's client, so it is kept out of
// the compare use case: cmd/gpupass hands it in (see compare.Poster).
package forgepost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/forge"
	ghforge "github.com/gpupass/gpupass/internal/forge/github"
	glforge "github.com/gpupass/gpupass/internal/forge/gitlab"
)

// Poster is the compare.Poster with the forge clients linked in.
type Poster struct{}

var _ compare.Poster = Poster{}

// Post posts the report as the sticky comment of o.Tag; nil, nil when
// the pipeline is not for a pull or merge request and o.Post is auto.
func (Poster) Post(ctx context.Context, mode compare.PostMode, o compare.Options, md string) (*forge.Result, error) {
	store, meta, err := target(mode, o)
	if store == nil || err != nil {
		return nil, err
	}
	full := "the job log"
	if o.Files.Markdown != "" {
		full = "`" + filepath.Base(o.Files.Markdown) + "` among the job's artifacts"
	}
	// Room is left for the sections other steps set (the audit's).
	body := forge.Compose(meta, md, forge.MaxChars-1-forge.SectionMaxChars, full)
	res, err := forge.Post(ctx, store, meta, body, o.Behavior)
	if err != nil {
		return nil, fmt.Errorf("posting the report to %s: %w", mode, err)
	}
	return &res, nil
}

// PostSection sets section s in the sticky comment of o.Tag, in place
// (forge.PostSection): the audit step's "signed by" in the compare
// report's comment. nil, nil as Post.
func (Poster) PostSection(ctx context.Context, mode compare.PostMode, o compare.Options, s forge.Section) (*forge.Result, error) {
	store, meta, err := target(mode, o)
	if store == nil || err != nil {
		return nil, err
	}
	s.RunID, s.SHA = meta.RunID, meta.SHA
	res, err := forge.PostSection(ctx, store, meta, s)
	if err != nil {
		return nil, fmt.Errorf("posting the %s section to %s: %w", s.Name, mode, err)
	}
	return &res, nil
}

// target is the pull or merge request the CI's variables (o.Getenv) and
// o name, and the marker of this pipeline's report; a nil Store when
// there is none and o.Post is auto.
func target(mode compare.PostMode, o compare.Options) (forge.Store, forge.Meta, error) {
	getenv, log := o.Getenv, o.Logger
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	rt := hc.Transport
	if _, ok := rt.(*forge.Retry); !ok {
		// Each try is bounded, not the whole: a client timeout would
		// also count the waits a Retry-After asks for.
		c := *hc
		c.Transport = &forge.Retry{Base: rt, Logger: log, AttemptTimeout: 30 * time.Second}
		hc = &c
	}
	var store forge.Store
	var meta forge.Meta
	switch mode {
	default:
		return nil, forge.Meta{}, fmt.Errorf("posting to %q: not a forge", mode)
	case compare.PostGitHub:
		tgt, run, ok, err := ghforge.FromEnv(getenv)
		if err != nil {
			return nil, forge.Meta{}, err
		}
		if !ok && o.PullRequest > 0 {
			// The workflow's own repository: a PR number alone
			// cannot send the comment anywhere else.
			if tgt.Owner == "" || tgt.Repo == "" {
				return nil, forge.Meta{}, errors.New("posting to github: GITHUB_REPOSITORY is not set: cannot tell which repository's pull request to comment on")
			}
			tgt.Number, ok = int(o.PullRequest), true
			// The dispatch's commit is the default branch's, not the
			// pull request's: the marker names none.
			run.SHA = ""
		}
		if !ok {
			if o.Post == compare.PostAuto {
				log.Info("not a pull request event and no pull request named: nothing posted")
				return nil, forge.Meta{}, nil
			}
			return nil, forge.Meta{}, &fielderr.Error{Field: compare.FieldPullRequest, Problem: "is required to post to github here: the workflow was not triggered by a pull request " +
				"(no pull_request in GITHUB_EVENT_PATH, GITHUB_REF is not refs/pull/N/merge); name the pull request to comment on, e.g. the ci.pull_request of the broker's webhook event"}
		}
		c, err := ghforge.New(tgt, firstNonEmpty(o.GitHubToken, getenv("GITHUB_TOKEN")), hc)
		if err != nil {
			return nil, forge.Meta{}, err
		}
		store, meta = c, forge.Meta{Tag: o.Tag, RunID: run.RunID, SHA: run.SHA}
	case compare.PostGitLab:
		tgt, run, ok, err := glforge.FromEnv(getenv)
		if err != nil {
			return nil, forge.Meta{}, err
		}
		if !ok && o.PullRequest > 0 {
			// The pipeline's own project: an iid alone cannot send the
			// note anywhere else.
			if tgt.APIURL == "" || tgt.Project == "" {
				return nil, forge.Meta{}, errors.New("posting to gitlab: CI_API_V4_URL or CI_PROJECT_ID is not set: cannot tell where to post the note")
			}
			tgt.IID, ok = o.PullRequest, true
			// A triggered pipeline runs on the trigger's ref (say
			// main), not the merge request's head: its commit and
			// commit time say nothing about the merge request, and a
			// main older than the merge request's head made the
			// verdict "older" than the in-progress note the merge
			// request's own pipeline posted, and skipped it. The
			// pipeline id alone orders the reports then.
			run.SHA, run.CommitTime = "", time.Time{}
		}
		if !ok {
			if o.Post == compare.PostAuto {
				log.Info("not a merge request pipeline and no merge request named: nothing posted")
				return nil, forge.Meta{}, nil
			}
			return nil, forge.Meta{}, &fielderr.Error{Field: compare.FieldPullRequest, Problem: "is required to post to gitlab here: not a merge request pipeline " +
				"(CI_MERGE_REQUEST_IID is not set); name the merge request to comment on, e.g. the ci.pull_request of the broker's webhook event"}
		}
		token := firstNonEmpty(o.GitLabToken, getenv("GITLAB_TOKEN"))
		if token == "" && getenv("CI_JOB_TOKEN") != "" {
			return nil, forge.Meta{}, errors.New("only CI_JOB_TOKEN is available: " + glforge.TokenHelp)
		}
		c, err := glforge.New(tgt, token, hc)
		if err != nil {
			return nil, forge.Meta{}, err
		}
		store, meta = c, forge.Meta{Tag: o.Tag, RunID: run.PipelineID, SHA: run.SHA, CommitTime: run.CommitTime}
	}
	return store, meta, nil
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}
