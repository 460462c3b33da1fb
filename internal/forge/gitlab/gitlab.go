// Package gitlab posts gpupass reports as sticky merge request notes
// through the GitLab REST API (gitlab.com/gitlab-org/api/client-go, the
// maintained continuation of the archived xanzy/go-gitlab). GitLab cannot hide
// notes, so delete-and-new deletes.
package gitlab

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	gl "gitlab.com/gitlab-org/api/client-go"

	"github.com/gpupass/gpupass/internal/forge"
)

// TokenHelp is what a user must do to let gpupass post MR notes.
const TokenHelp = "a CI job token cannot post merge request notes: create a project access token (Settings > Access tokens, role Reporter or higher, scope `api`), store it as a masked CI/CD variable and pass it as GITLAB_TOKEN (or --gitlab-token)"

// Target is the merge request to comment on.
type Target struct {
	APIURL  string // CI_API_V4_URL, e.g. https://gitlab.example/api/v4
	Project string // CI_MERGE_REQUEST_PROJECT_ID (id or path)
	IID     int64  // CI_MERGE_REQUEST_IID
}

// Run describes the pipeline, for the sticky marker.
type Run struct {
	PipelineID int64
	SHA        string
	CommitTime time.Time
}

// FromEnv reads the merge request and pipeline from GitLab CI variables.
// ok is false outside a merge request pipeline.
func FromEnv(getenv func(string) string) (Target, Run, bool, error) {
	t := Target{APIURL: getenv("CI_API_V4_URL"), Project: getenv("CI_MERGE_REQUEST_PROJECT_ID")}
	if t.Project == "" {
		t.Project = getenv("CI_PROJECT_ID")
	}
	r := Run{SHA: getenv("CI_COMMIT_SHA")}
	if v := getenv("CI_PIPELINE_ID"); v != "" {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return t, r, false, fmt.Errorf("CI_PIPELINE_ID %q is not a number", v)
		}
		r.PipelineID = id
	}
	if v := getenv("CI_COMMIT_TIMESTAMP"); v != "" {
		ct, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return t, r, false, fmt.Errorf("CI_COMMIT_TIMESTAMP %q is not RFC 3339", v)
		}
		r.CommitTime = ct
	}
	iid := getenv("CI_MERGE_REQUEST_IID")
	if iid == "" {
		return t, r, false, nil
	}
	n, err := strconv.ParseInt(iid, 10, 64)
	if err != nil || n <= 0 {
		return t, r, false, fmt.Errorf("CI_MERGE_REQUEST_IID %q is not a merge request number", iid)
	}
	t.IID = n
	if t.APIURL == "" || t.Project == "" {
		return t, r, false, errors.New("CI_API_V4_URL or CI_MERGE_REQUEST_PROJECT_ID is not set: cannot tell where to post the note")
	}
	return t, r, true, nil
}

// Client posts to one merge request.
type Client struct {
	gl *gl.Client
	t  Target
	// self is the id of the account the token posts as, once known
	// (a project access token's bot user).
	self int64
}

// New returns a client for t. token must be a project (or personal)
// access token; hc should carry forge.Retry (go-gitlab's own retries are
// turned off so both forges behave the same).
func New(t Target, token string, hc *http.Client) (*Client, error) {
	if token == "" {
		return nil, errors.New("no GitLab token: " + TokenHelp)
	}
	c, err := gl.NewClient(token, gl.WithBaseURL(t.APIURL), gl.WithHTTPClient(hc), gl.WithoutRetries())
	if err != nil {
		return nil, fmt.Errorf("CI_API_V4_URL %q: %w", t.APIURL, err)
	}
	return &Client{gl: c, t: t}, nil
}

var _ forge.Store = (*Client)(nil)

// List returns every note of the merge request, oldest first, all pages,
// with Mine set on those the token's account wrote.
func (c *Client) List(ctx context.Context) ([]forge.Comment, error) {
	var out []forge.Comment
	var authors []int64
	opt := &gl.ListMergeRequestNotesOptions{ListOptions: gl.ListOptions{PerPage: 100}, OrderBy: gl.Ptr("created_at"), Sort: gl.Ptr("asc")}
	for {
		ns, resp, err := c.gl.Notes.ListMergeRequestNotes(c.t.Project, c.t.IID, opt, gl.WithContext(ctx))
		if err != nil {
			return nil, c.explain(err, "listing merge request notes")
		}
		for _, n := range ns {
			if n.System {
				continue
			}
			out = append(out, forge.Comment{ID: n.ID, Body: n.Body})
			authors = append(authors, n.Author.ID)
		}
		if resp.NextPage == 0 {
			break
		}
		opt.Page = resp.NextPage
	}
	for i := range out {
		// Who the token is matters only for notes that look like
		// reports: most merge requests have none, and need no lookup.
		if _, ok := forge.ParseMarker(out[i].Body); !ok {
			continue
		}
		if c.self == 0 {
			u, _, err := c.gl.Users.CurrentUser(gl.WithContext(ctx))
			if err != nil {
				return nil, c.explain(err, "finding which account the token posts as")
			}
			c.self = u.ID
		}
		out[i].Mine = authors[i] == c.self
	}
	return out, nil
}

// Create adds a note.
func (c *Client) Create(ctx context.Context, body string) (int64, string, error) {
	n, _, err := c.gl.Notes.CreateMergeRequestNote(c.t.Project, c.t.IID, &gl.CreateMergeRequestNoteOptions{Body: gl.Ptr(body)}, gl.WithContext(ctx))
	if err != nil {
		return 0, "", c.explain(err, "creating the report note")
	}
	return n.ID, "", nil
}

// Update edits a note.
func (c *Client) Update(ctx context.Context, id int64, body string) (string, error) {
	if _, _, err := c.gl.Notes.UpdateMergeRequestNote(c.t.Project, c.t.IID, id, &gl.UpdateMergeRequestNoteOptions{Body: gl.Ptr(body)}, gl.WithContext(ctx)); err != nil {
		return "", c.explain(err, "updating the report note")
	}
	return "", nil
}

// Delete removes a note.
func (c *Client) Delete(ctx context.Context, id int64) error {
	if _, err := c.gl.Notes.DeleteMergeRequestNote(c.t.Project, c.t.IID, id, gl.WithContext(ctx)); err != nil {
		return c.explain(err, "deleting an old report note")
	}
	return nil
}

// explain names the merge request, the status, the endpoint and the
// likely missing permission.
func (c *Client) explain(err error, doing string) error {
	doing = fmt.Sprintf("%s on GitLab merge request !%d of project %s", doing, c.t.IID, c.t.Project)
	var er *gl.ErrorResponse
	if !errors.As(err, &er) || er.Response == nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	resp := er.Response
	endpoint := resp.Request.Method + " " + resp.Request.URL.Path
	msg := strings.TrimSpace(er.Message)
	if msg != "" {
		msg = ": " + msg
	}
	var h string
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		h = " (token missing, invalid or refused; " + TokenHelp + ")"
	case http.StatusNotFound:
		h = " (project or merge request not found, or the token cannot see it: the project access token needs role Reporter or higher on this project)"
	}
	return fmt.Errorf("%s: GitLab answered %s to %s%s%s", doing, resp.Status, endpoint, msg, h)
}
