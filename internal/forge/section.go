package forge

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// A Section is a delimited part of a sticky comment that a step other
// than the one posting the report owns: the audit step's "signed by"
// section in the compare report's comment. It is kept apart so that each
// step edits only its own part of the one comment on the pull or merge
// request, found by the report's marker: the audit step sets its section
// in place (PostSection), and a later report of the same commit keeps it
// (Post).
type Section struct {
	// Name says which step owns the section ("signed-by"): letters,
	// digits and dashes.
	Name string
	// RunID and SHA are the pipeline that wrote the section: a report of
	// another commit drops it, as it speaks of another commit's run.
	RunID int64
	SHA   string
	// Markdown is the section's text, at most SectionMaxChars characters
	// (longer is cut).
	Markdown string
}

// SectionMaxChars bounds a section; report bodies are composed to leave
// this much room below MaxChars, so that setting a section never pushes
// a comment past the forge's limit.
const SectionMaxChars = 4096

// sectionRE matches a whole section: its opening line, the markdown and
// its closing line, in a body where Render put it.
var sectionRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?s)\n*<!-- gpupass:section name="([a-z0-9-]+)" run=(\d+) sha=(\S+) -->\n(.*?)\n<!-- /gpupass:section name="([a-z0-9-]+)" -->\n?`)
})

// Render is the section as it stands in a comment, delimited by hidden
// lines naming it and the pipeline that wrote it.
func (s Section) Render() string {
	md := strings.TrimSpace(s.Markdown)
	// Nothing inside may close the section or open another.
	md = strings.NewReplacer("<!--", "&lt;!--", "-->", "--&gt;").Replace(md)
	if utf8.RuneCountInString(md) > SectionMaxChars-200 {
		md = string([]rune(md)[:SectionMaxChars-200]) + "…"
	}
	sha := s.SHA
	if sha == "" {
		sha = "-"
	}
	return fmt.Sprintf("<!-- gpupass:section name=%q run=%d sha=%s -->\n%s\n<!-- /gpupass:section name=%q -->\n", s.Name, s.RunID, sha, md, s.Name)
}

// FindSection reads the section called name from a comment body.
func FindSection(body, name string) (Section, bool) {
	for _, m := range sectionRE().FindAllStringSubmatch(body, -1) {
		if m[1] != name || m[5] != name {
			continue
		}
		run, _ := strconv.ParseInt(m[2], 10, 64)
		s := Section{Name: name, RunID: run, Markdown: m[4]}
		if m[3] != "-" {
			s.SHA = m[3]
		}
		return s, true
	}
	return Section{}, false
}

// SetSection returns body with its section of s.Name replaced by s, or,
// when it has none, with s appended; every other copy of the section is
// dropped, so that setting it again never adds a second one.
func SetSection(body string, s Section) string {
	return strings.TrimRight(withoutSection(body, s.Name), "\n") + "\n\n" + s.Render()
}

// withoutSection is body without any section called name.
func withoutSection(body, name string) string {
	return sectionRE().ReplaceAllStringFunc(body, func(m string) string {
		if sub := sectionRE().FindStringSubmatch(m); sub[1] == name && sub[5] == name {
			return "\n"
		}
		return m
	})
}

// keep is the section of the newest report comment a new report of meta
// carries over: every section written by the same pipeline or for the
// same commit. A section of another commit is dropped: it speaks of
// another commit's runs.
func keep(existing []Comment, meta Meta, body string) string {
	last, ok := lastMine(existing, meta)
	if !ok {
		return body
	}
	for _, m := range sectionRE().FindAllStringSubmatch(last.Body, -1) {
		if m[1] != m[5] || strings.Contains(body, fmt.Sprintf("<!-- gpupass:section name=%q ", m[1])) {
			continue
		}
		s, _ := FindSection(last.Body, m[1])
		if s.RunID == meta.RunID || (s.SHA != "" && s.SHA == meta.SHA) {
			body = SetSection(body, s)
		}
	}
	return body
}

// lastMine is the comment Plan would edit: the last of gpupass's own
// comments whose marker carries meta.Tag.
func lastMine(existing []Comment, meta Meta) (Comment, bool) {
	tag := sanitizeTag(meta.Tag)
	var last Comment
	found := false
	for _, c := range existing {
		if m, ok := ParseMarker(c.Body); ok && c.Mine && m.Tag == tag {
			last, found = c, true
		}
	}
	return last, found
}

// PostSection sets section s in the sticky comment of meta.Tag on st:
// the comment a report already has is edited in place, its marker and
// report kept, its earlier copy of s replaced; with no report comment
// yet, one is created holding only s under meta's marker, and the report
// posted later goes into it. A comment of a newer pipeline is left alone:
// its report is not this pipeline's.
func PostSection(ctx context.Context, st Store, meta Meta, s Section) (Result, error) {
	existing, err := st.List(ctx)
	if err != nil {
		return Result{}, err
	}
	last, ok := lastMine(existing, meta)
	if !ok {
		id, url, err := st.Create(ctx, SetSection(meta.Marker(), s))
		if err != nil {
			return Result{}, err
		}
		return Result{Action: "created", ID: id, URL: url, Reason: "no report comment with this tag yet: the section waits for the report"}, nil
	}
	if m, _ := ParseMarker(last.Body); m.Newer(meta) {
		return Result{Action: "skipped", ID: last.ID, URL: last.URL, Reason: fmt.Sprintf("the report comment is a newer pipeline's (run %d); not adding run %d's section to it", m.RunID, meta.RunID)}, nil
	}
	body := SetSection(last.Body, s)
	if body == last.Body {
		return Result{Action: "skipped", ID: last.ID, URL: last.URL, Reason: "section unchanged"}, nil
	}
	url, err := st.Update(ctx, last.ID, body)
	if err != nil {
		return Result{}, err
	}
	return Result{Action: "updated", ID: last.ID, URL: url, Reason: "section set in the report comment"}, nil
}
