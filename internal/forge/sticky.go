// Package forge holds what the GitHub and GitLab posters share: the hidden
// marker that makes a report comment sticky, the decision what to do with
// the comments already there, safe truncation, and HTTP retries.
// Implementations live in forge/github and forge/gitlab.
package forge

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// Behavior says what to do with an existing sticky comment.
type Behavior string

// Behaviours of --comment-behavior.
const (
	Update       Behavior = "update"         // edit the comment in place (default)
	New          Behavior = "new"            // add a comment, leave older ones
	DeleteAndNew Behavior = "delete-and-new" // delete older ones, then add
)

// FieldBehavior is the field of ParseBehavior's error (*fielderr.Error).
const FieldBehavior = "comment behavior"

// FieldGitHubToken is the field of github.New's error for a missing
// token. It is named here, beside the other forge fields, so that the
// command layer can rename it without linking the GitHub client.
const FieldGitHubToken = "GitHub token (GITHUB_TOKEN)"

// ParseBehavior validates a comment behavior.
func ParseBehavior(s string) (Behavior, error) {
	switch b := Behavior(s); b {
	case Update, New, DeleteAndNew:
		return b, nil
	}
	return "", fielderr.New(FieldBehavior, s, "must be update, new or delete-and-new")
}

// Meta identifies a report: its tag (one sticky comment per tag) and the
// pipeline that made it, so an older pipeline never overwrites a newer
// one's report.
type Meta struct {
	Tag string
	// CommitTime is the committer time of the commit the pipeline ran on
	// (zero when unknown).
	CommitTime time.Time
	// RunID is the CI run or pipeline id; ids grow over time.
	RunID int64
	SHA   string
}

// markerRE matches a marker at the very start of a body, where Compose
// puts it: a marker quoted or pasted further down is not a report.
// Compiled on first use: gpupass links this package for compare's types,
// and most of its processes never read a comment.
var markerRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^<!-- gpupass:report tag="([^"]*)" run=(\d+) commit_time=(\S*) sha=(\S*) -->`)
})

// Marker is the hidden first line of a sticky comment.
func (m Meta) Marker() string {
	ct := "-"
	if !m.CommitTime.IsZero() {
		ct = m.CommitTime.UTC().Format(time.RFC3339)
	}
	sha := m.SHA
	if sha == "" {
		sha = "-"
	}
	return fmt.Sprintf(`<!-- gpupass:report tag="%s" run=%d commit_time=%s sha=%s -->`, sanitizeTag(m.Tag), m.RunID, ct, sha)
}

func sanitizeTag(t string) string {
	return strings.NewReplacer(`"`, "'", "-->", "- ->", "\n", " ").Replace(t)
}

// ParseMarker reads the gpupass marker that starts a comment body.
func ParseMarker(body string) (Meta, bool) {
	m := markerRE().FindStringSubmatch(body)
	if m == nil {
		return Meta{}, false
	}
	run, _ := strconv.ParseInt(m[2], 10, 64)
	meta := Meta{Tag: m[1], RunID: run}
	if m[3] != "-" {
		meta.CommitTime, _ = time.Parse(time.RFC3339, m[3])
	}
	if m[4] != "-" {
		meta.SHA = m[4]
	}
	return meta, true
}

// Newer reports whether m comes from a later pipeline than o: a later
// commit first, then a higher run id for the same commit time.
func (m Meta) Newer(o Meta) bool {
	if !m.CommitTime.IsZero() && !o.CommitTime.IsZero() && !m.CommitTime.Equal(o.CommitTime) {
		return m.CommitTime.After(o.CommitTime)
	}
	return m.RunID > o.RunID
}

// Comment is a comment or note already on the pull/merge request.
type Comment struct {
	ID   int64
	Body string
	// Mine is set by the Store when the account gpupass posts as wrote
	// the comment. Plan never edits, deletes or defers to anyone else's:
	// anybody who can comment could otherwise copy a marker with a huge
	// run id into their own comment and silence every later report, or
	// get their comment overwritten.
	Mine bool
	URL  string // where a person sees it, when the forge says
}

// Action kinds.
const (
	ActCreate = "create"
	ActUpdate = "update"
	ActSkip   = "skip"
)

// Action is what Plan decided.
type Action struct {
	Kind   string
	Update int64   // comment to edit (ActUpdate)
	Delete []int64 // comments to delete first
	Reason string
}

// Plan decides what to do with body given the comments already there.
// Comments are in creation order. Only comments of gpupass's own account
// (Mine) whose marker carries meta.Tag are considered.
func Plan(existing []Comment, meta Meta, body string, b Behavior) Action {
	var mine []Comment
	var newest *Meta
	tag := sanitizeTag(meta.Tag) // as Marker wrote it
	for _, c := range existing {
		m, ok := ParseMarker(c.Body)
		if !ok || !c.Mine || m.Tag != tag {
			continue
		}
		mine = append(mine, c)
		if newest == nil || m.Newer(*newest) {
			mm := m
			newest = &mm
		}
	}
	if len(mine) == 0 {
		return Action{Kind: ActCreate, Reason: "no report comment with this tag yet"}
	}
	if newest.Newer(meta) {
		return Action{Kind: ActSkip, Reason: fmt.Sprintf("a newer pipeline's report is posted (run %d%s); not overwriting it with run %d", newest.RunID, commitNote(newest.CommitTime), meta.RunID)}
	}
	last := mine[len(mine)-1]
	if stripMarker(last.Body) == stripMarker(body) {
		return Action{Kind: ActSkip, Reason: "report unchanged"}
	}
	switch b {
	case New:
		return Action{Kind: ActCreate, Reason: "behavior new"}
	case DeleteAndNew:
		a := Action{Kind: ActCreate, Reason: "behavior delete-and-new"}
		for _, c := range mine {
			a.Delete = append(a.Delete, c.ID)
		}
		return a
	}
	a := Action{Kind: ActUpdate, Update: last.ID, Reason: "updating the report comment in place"}
	// Duplicates (from "new" runs or races) are cleaned up so one stays.
	for _, c := range mine[:len(mine)-1] {
		a.Delete = append(a.Delete, c.ID)
	}
	return a
}

func commitNote(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return ", commit time " + t.UTC().Format(time.RFC3339)
}

func stripMarker(body string) string {
	return strings.TrimSpace(markerRE().ReplaceAllString(body, ""))
}

// MaxChars is the GitHub comment limit (65,536 characters); bodies are
// cut below it.
const MaxChars = 65536

// Compose builds the comment body: marker, then markdown cut to fit
// limit characters with a note pointing at the full report.
func Compose(meta Meta, markdown string, limit int, fullReport string) string {
	head := meta.Marker() + "\n"
	return head + Truncate(markdown, limit-utf8.RuneCountInString(head), fullReport)
}

// Truncate cuts md to at most limit characters (runes) at a line
// boundary, closes an open code fence so the rest still renders, and
// appends a note naming where the full report is.
func Truncate(md string, limit int, fullReport string) string {
	total := utf8.RuneCountInString(md)
	if total <= limit {
		return md
	}
	if fullReport == "" {
		fullReport = "the job's artifacts"
	}
	note := fmt.Sprintf("\n\n> ✂️ Report truncated at %%d of %d characters; the full report is in %s.\n", total, fullReport)
	budget := limit - utf8.RuneCountInString(fmt.Sprintf(note, total)) - len(closeFence) - len(closeDetails)
	if budget < 0 {
		budget = 0
	}
	// Cut at a rune, then back to the last newline.
	cut := md
	n := 0
	for i := range md {
		if n == budget {
			cut = md[:i]
			break
		}
		n++
	}
	if j := strings.LastIndexByte(cut, '\n'); j > 0 {
		cut = cut[:j+1]
	}
	if openFence(cut) {
		cut += closeFence
	}
	// A cut inside <details> would swallow the note.
	if strings.Count(cut, "<details>") > strings.Count(cut, "</details>") {
		cut += closeDetails
	}
	return cut + fmt.Sprintf(note, utf8.RuneCountInString(cut))
}

// What Truncate may add to close a cut: the budget leaves room for both.
const (
	closeFence   = "```\n"
	closeDetails = "\n</details>\n"
)

// openFence reports whether md ends inside a fenced code block: fences
// are lines that start with three backticks (a backtick run inside a line,
// say in a quoted value, opens nothing).
func openFence(md string) bool {
	open := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(strings.TrimLeft(line, " "), "```") {
			open = !open
		}
	}
	return open
}

// Result says what a poster did.
type Result struct {
	Action  string `json:"action"` // created | updated | skipped
	ID      int64  `json:"id,omitempty"`
	URL     string `json:"url,omitempty"`
	Deleted int    `json:"deleted,omitempty"`
	Reason  string `json:"reason"`
}

// Store is the forge side a sticky comment needs: comments of one pull or
// merge request. Create returns an error for which Uncertain holds when
// the comment may have been created all the same (the forge answered 5xx,
// or the connection broke after the request was sent); errors name the
// forge, the pull or merge request and the step.
type Store interface {
	List(ctx context.Context) ([]Comment, error)
	Create(ctx context.Context, body string) (id int64, url string, err error)
	Update(ctx context.Context, id int64, body string) (url string, err error)
	Delete(ctx context.Context, id int64) error
}

// Post makes body the sticky report for meta.Tag on s, keeping the
// sections (Section) of the comment it replaces that this pipeline or
// commit wrote.
func Post(ctx context.Context, s Store, meta Meta, body string, b Behavior) (Result, error) {
	existing, err := s.List(ctx)
	if err != nil {
		return Result{}, err
	}
	// Another step's section in the report comment (the audit's "signed
	// by") stays when it speaks of this commit.
	body = keep(existing, meta, body)
	a := Plan(existing, meta, body, b)
	res := Result{Reason: a.Reason}
	if a.Kind == ActSkip {
		res.Action = "skipped"
		return res, nil
	}
	// The new report goes up before old ones are deleted, so a refused
	// edit or post leaves the last report in place rather than none.
	if a.Kind == ActUpdate {
		url, err := s.Update(ctx, a.Update, body)
		if err != nil {
			return res, err
		}
		res.Action, res.ID, res.URL = "updated", a.Update, url
	} else {
		id, url, skip, err := create(ctx, s, existing, meta, body, b)
		if err != nil {
			return res, err
		}
		if skip != "" {
			// Old reports are the newer pipeline's to clean up.
			res.Action, res.Reason = "skipped", skip
			return res, nil
		}
		res.Action, res.ID, res.URL = "created", id, url
	}
	for _, id := range a.Delete {
		if err := s.Delete(ctx, id); err != nil {
			return res, fmt.Errorf("the report is %s, but an older one is left (the next run deletes it, or delete it by hand): %w", res.Action, err)
		}
		res.Deleted++
	}
	return res, nil
}

// createTries bounds how often create posts a report that each time may
// or may not have been created.
const createTries = 3

// create posts body. After a failure that leaves open whether the forge
// created the comment, it lists the comments again and takes as the
// report one of ours, absent from existing, that carries this run's
// marker; blindly resending would leave two identical reports until a
// later run cleaned up. Only when there is none does it post again, and
// not when a newer pipeline's report has appeared meanwhile: skip then
// says why.
func create(ctx context.Context, s Store, existing []Comment, meta Meta, body string, b Behavior) (id int64, url, skip string, err error) {
	seen := make(map[int64]bool, len(existing))
	for _, c := range existing {
		seen[c.ID] = true
	}
	marker := meta.Marker()
	for try := 1; ; try++ {
		id, url, err := s.Create(ctx, body)
		if err == nil || !Uncertain(err) {
			return id, url, "", err
		}
		now, lerr := s.List(ctx)
		if lerr != nil {
			return 0, "", "", fmt.Errorf("%w; then, looking whether the report was created anyway: %w", err, lerr)
		}
		for _, c := range now {
			if seen[c.ID] || !c.Mine || !strings.HasPrefix(c.Body, marker) {
				continue
			}
			if c.Body == body {
				return c.ID, c.URL, "", nil
			}
			// The forge kept the post but not as sent (it may rewrite
			// line endings, say): one edit makes it the report.
			url, err := s.Update(ctx, c.ID, body)
			return c.ID, cmp.Or(url, c.URL), "", err
		}
		if a := Plan(now, meta, body, b); a.Kind == ActSkip {
			return 0, "", a.Reason, nil
		}
		if try == createTries {
			return 0, "", "", fmt.Errorf("giving up after %d posts: each may have been applied, yet listing again found none of them (look for the report on the pull or merge request, then rerun the job): %w", try, err)
		}
	}
}
