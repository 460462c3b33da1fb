// Package github posts gpupass reports as sticky pull request comments
// through the GitHub REST API (google/go-github), for github.com and
// GitHub Enterprise (GITHUB_API_URL).
package github

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	gh "github.com/google/go-github/v73/github"
	"github.com/sethvargo/go-githubactions"

	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/forge"
)

// Target is the pull request to comment on.
type Target struct {
	APIURL string // e.g. https://api.github.com or https://ghe.example/api/v3
	Owner  string
	Repo   string
	Number int
}

// Run describes the workflow run, for the sticky marker.
type Run struct {
	RunID int64
	SHA   string
}

// pullRef is the ref GitHub runs a pull request's workflows on.
var pullRef = regexp.MustCompile(`^refs/pull/([0-9]{1,10})/(?:merge|head)$`)

// FromEnv reads the pull request from the Actions event payload
// (GITHUB_EVENT_PATH), else from GITHUB_REF (refs/pull/N/merge), and the
// run from the environment. ok is false when
// the workflow was not triggered by a pull request.
func FromEnv(getenv func(string) string) (Target, Run, bool, error) {
	c, err := githubactions.New(githubactions.WithGetenv(getenv)).Context()
	if err != nil {
		return Target{}, Run{}, false, fmt.Errorf("reading the GitHub Actions context: %w", err)
	}
	owner, repo := c.Repo()
	t := Target{APIURL: c.APIURL, Owner: owner, Repo: repo}
	r := Run{RunID: c.RunID, SHA: c.SHA}
	if pr, ok := c.Event["pull_request"].(map[string]any); ok {
		if n, ok := pr["number"].(float64); ok {
			t.Number = int(n)
		}
		if head, ok := pr["head"].(map[string]any); ok {
			if sha, ok := head["sha"].(string); ok && sha != "" {
				r.SHA = sha
			}
		}
	} else if issue, ok := c.Event["issue"].(map[string]any); ok {
		if _, isPR := issue["pull_request"]; isPR {
			if n, ok := issue["number"].(float64); ok {
				t.Number = int(n)
			}
		}
	}
	if t.Number == 0 {
		// A pull request's workflows run on its merge ref even when the
		// event (pull_request_target, a custom one) carries no number.
		if m := pullRef.FindStringSubmatch(getenv("GITHUB_REF")); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil && n > 0 {
				t.Number = n
			}
		}
	}
	if t.Number == 0 {
		return t, r, false, nil
	}
	if t.Owner == "" || t.Repo == "" {
		return t, r, false, fmt.Errorf("GITHUB_REPOSITORY is not set: cannot tell which repository to comment on")
	}
	return t, r, true, nil
}

// Client posts to one pull request.
type Client struct {
	gh *gh.Client
	t  Target
	// owns, once known, says whether a comment's author is the account
	// this token posts as.
	owns func(*gh.User) bool
}

// FieldToken is the field of New's error for a missing token
// (*fielderr.Error); GITHUB_TOKEN is how a workflow usually gives it.
const FieldToken = forge.FieldGitHubToken

// New returns a client for t that authenticates with token and sends
// requests through hc (which should carry forge.Retry).
func New(t Target, token string, hc *http.Client) (*Client, error) {
	if token == "" {
		return nil, &fielderr.Error{Field: FieldToken, Problem: "is required, with `pull-requests: write` permission, e.g. `env: GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}` and `permissions: pull-requests: write`"}
	}
	c := gh.NewClient(hc).WithAuthToken(token)
	api := t.APIURL
	if api == "" {
		return nil, errors.New("GITHUB_API_URL is not set: cannot tell which GitHub API to call")
	}
	u, err := url.Parse(strings.TrimSuffix(api, "/") + "/")
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("GITHUB_API_URL %q is not a URL", api)
	}
	c.BaseURL = u
	return &Client{gh: c, t: t}, nil
}

var _ forge.Store = (*Client)(nil)

// List returns every issue comment of the pull request, all pages,
// with Mine set on those the token's account wrote.
func (c *Client) List(ctx context.Context) ([]forge.Comment, error) {
	var out []forge.Comment
	var authors []*gh.User
	opt := &gh.IssueListCommentsOptions{ListOptions: gh.ListOptions{PerPage: 100}}
	for {
		cs, resp, err := c.gh.Issues.ListComments(ctx, c.t.Owner, c.t.Repo, c.t.Number, opt)
		if err != nil {
			return nil, c.explain(err, "listing comments")
		}
		for _, cm := range cs {
			out = append(out, forge.Comment{ID: cm.GetID(), Body: cm.GetBody(), URL: cm.GetHTMLURL()})
			authors = append(authors, cm.GetUser())
		}
		if resp.NextPage == 0 {
			break
		}
		opt.Page = resp.NextPage
	}
	for i := range out {
		// Who the token is matters only for comments that look like
		// reports: most pull requests have none, and need no lookup.
		if _, ok := forge.ParseMarker(out[i].Body); !ok {
			continue
		}
		owns, err := c.owner(ctx)
		if err != nil {
			return nil, err
		}
		out[i].Mine = owns(authors[i])
	}
	return out, nil
}

// owner learns which account the token posts as. A personal or OAuth
// token can read it from GET /user. GitHub App installation tokens,
// GITHUB_TOKEN among them, are refused there (403 "Resource not
// accessible by integration"); they post as the app's bot account
// ("github-actions[bot]" for GITHUB_TOKEN), so comments by a Bot are
// taken as gpupass's own and comments by people never are.
func (c *Client) owner(ctx context.Context) (func(*gh.User) bool, error) {
	if c.owns != nil {
		return c.owns, nil
	}
	u, _, err := c.gh.Users.Get(ctx, "")
	var er *gh.ErrorResponse
	switch {
	case err == nil && u.GetLogin() != "":
		login := u.GetLogin()
		c.owns = func(a *gh.User) bool { return strings.EqualFold(a.GetLogin(), login) }
	case errors.As(err, &er) && er.Response != nil && er.Response.StatusCode == http.StatusForbidden:
		c.owns = func(a *gh.User) bool { return a.GetType() == "Bot" }
	case err == nil:
		return nil, c.explain(errors.New("GitHub's GET /user gave no login"), "finding which account the token posts as")
	default:
		return nil, c.explain(err, "finding which account the token posts as")
	}
	return c.owns, nil
}

// Create adds a comment.
func (c *Client) Create(ctx context.Context, body string) (int64, string, error) {
	cm, _, err := c.gh.Issues.CreateComment(ctx, c.t.Owner, c.t.Repo, c.t.Number, &gh.IssueComment{Body: gh.Ptr(body)})
	if err != nil {
		return 0, "", c.explain(err, "creating the report comment")
	}
	return cm.GetID(), cm.GetHTMLURL(), nil
}

// Update edits a comment.
func (c *Client) Update(ctx context.Context, id int64, body string) (string, error) {
	cm, _, err := c.gh.Issues.EditComment(ctx, c.t.Owner, c.t.Repo, id, &gh.IssueComment{Body: gh.Ptr(body)})
	if err != nil {
		return "", c.explain(err, "updating the report comment")
	}
	return cm.GetHTMLURL(), nil
}

// Delete removes a comment.
func (c *Client) Delete(ctx context.Context, id int64) error {
	if _, err := c.gh.Issues.DeleteComment(ctx, c.t.Owner, c.t.Repo, id); err != nil {
		return c.explain(err, "deleting an old report comment")
	}
	return nil
}

// explain turns an API error into one that names the pull request, the
// status, the endpoint and the permission that is likely missing.
func (c *Client) explain(err error, doing string) error {
	doing = fmt.Sprintf("%s on GitHub pull request %s/%s#%d", doing, c.t.Owner, c.t.Repo, c.t.Number)
	var er *gh.ErrorResponse
	var ar *gh.AbuseRateLimitError
	var rl *gh.RateLimitError
	switch {
	case errors.As(err, &er) && er.Response != nil:
		resp := er.Response
		endpoint := resp.Request.Method + " " + resp.Request.URL.Path
		return fmt.Errorf("%s: GitHub answered %s to %s: %s%s", doing, resp.Status, endpoint, er.Message, hint(resp.StatusCode))
	case errors.As(err, &ar) && ar.Response != nil:
		return fmt.Errorf("%s: GitHub secondary rate limit on %s %s persisted after retries: %s", doing, ar.Response.Request.Method, ar.Response.Request.URL.Path, ar.Message)
	case errors.As(err, &rl) && rl.Response != nil:
		return fmt.Errorf("%s: GitHub rate limit exhausted on %s %s until %s", doing, rl.Response.Request.Method, rl.Response.Request.URL.Path, rl.Rate.Reset.UTC().Format("15:04:05 UTC"))
	}
	return fmt.Errorf("%s: %w", doing, err)
}

func hint(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return " (the token is missing, expired or invalid: check GITHUB_TOKEN)"
	case http.StatusForbidden:
		return " (the token likely lacks `pull-requests: write` permission — add `permissions: pull-requests: write` to the job; on pull requests from forks GITHUB_TOKEN is read-only)"
	case http.StatusNotFound:
		return " (repository, pull request or comment not found, or the token cannot see it: a private repository needs `contents: read` and `pull-requests: write`)"
	case http.StatusUnprocessableEntity:
		return " (GitHub rejected the body; it may be over the 65,536-character limit)"
	}
	return ""
}
