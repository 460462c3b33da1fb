package forge

import (
	"context"
	"strings"
	"testing"
)

// memStore is a Store that keeps the comments it is given, as a forge
// does: what a reader of the pull request sees after each step.
type memStore struct{ comments []Comment }

func (s *memStore) List(context.Context) ([]Comment, error) {
	return append([]Comment(nil), s.comments...), nil
}
func (s *memStore) Create(_ context.Context, body string) (int64, string, error) {
	id := int64(len(s.comments) + 100)
	s.comments = append(s.comments, Comment{ID: id, Body: body, Mine: true})
	return id, "", nil
}
func (s *memStore) Update(_ context.Context, id int64, body string) (string, error) {
	for i := range s.comments {
		if s.comments[i].ID == id {
			s.comments[i].Body = body
		}
	}
	return "", nil
}
func (s *memStore) Delete(_ context.Context, id int64) error {
	for i := range s.comments {
		if s.comments[i].ID == id {
			s.comments = append(s.comments[:i], s.comments[i+1:]...)
			return nil
		}
	}
	return nil
}

// TestSectionInReportComment: the audit's signed-by section goes into
// the one sticky comment of the report, in place; setting it again
// replaces it; the report posted after keeps it for the same commit and
// drops it for another; a comment waiting for the report holds the
// section alone under the marker, and the report goes into it.
func TestSectionInReportComment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run1 := Meta{Tag: "compare", RunID: 1, SHA: "aaa"}
	sec := func(text string) Section { return Section{Name: "signed-by", RunID: 1, SHA: "aaa", Markdown: text} }
	count := func(b, s string) int { return strings.Count(b, s) }

	t.Run("report first, then the section, twice, then the report again", func(t *testing.T) {
		t.Parallel()
		st := &memStore{}
		if _, err := Post(ctx, st, run1, Compose(run1, "verdict: consistent", MaxChars, ""), Update); err != nil {
			t.Fatal(err)
		}
		for _, text := range []string{"signed by A", "signed by B"} {
			res, err := PostSection(ctx, st, run1, sec(text))
			if err != nil || res.Action != "updated" {
				t.Fatalf("PostSection: %+v, %v", res, err)
			}
		}
		if len(st.comments) != 1 {
			t.Fatalf("%d comments, want the one report comment", len(st.comments))
		}
		b := st.comments[0].Body
		if !strings.HasPrefix(b, run1.Marker()) || !strings.Contains(b, "verdict: consistent") || !strings.Contains(b, "signed by B") || strings.Contains(b, "signed by A") || count(b, "<!-- gpupass:section ") != 1 {
			t.Fatalf("body after two audits:\n%s", b)
		}
		if res, _ := PostSection(ctx, st, run1, sec("signed by B")); res.Action != "skipped" {
			t.Errorf("the same section again: %s, want skipped", res.Action)
		}
		// The report edited again (the same commit): the section stays.
		if _, err := Post(ctx, st, run1, Compose(run1, "verdict: diverged", MaxChars, ""), Update); err != nil {
			t.Fatal(err)
		}
		b = st.comments[0].Body
		if len(st.comments) != 1 || !strings.Contains(b, "verdict: diverged") || !strings.Contains(b, "signed by B") || count(b, "<!-- gpupass:section ") != 1 {
			t.Fatalf("report edited after the audit:\n%s", b)
		}
		// The report of a later commit: its audit is yet to come.
		run2 := Meta{Tag: "compare", RunID: 2, SHA: "bbb"}
		if _, err := Post(ctx, st, run2, Compose(run2, "verdict: consistent", MaxChars, ""), Update); err != nil {
			t.Fatal(err)
		}
		if b := st.comments[0].Body; strings.Contains(b, "signed by") {
			t.Errorf("a later commit's report kept the earlier commit's section:\n%s", b)
		}
		// And an audit of the older pipeline, late, leaves it alone.
		if res, _ := PostSection(ctx, st, run1, sec("late")); res.Action != "skipped" || strings.Contains(st.comments[0].Body, "late") {
			t.Errorf("an older pipeline's section went into a newer report: %+v\n%s", res, st.comments[0].Body)
		}
	})

	t.Run("section first: the report goes into its comment", func(t *testing.T) {
		t.Parallel()
		st := &memStore{}
		if res, err := PostSection(ctx, st, run1, sec("signed by A")); err != nil || res.Action != "created" {
			t.Fatalf("PostSection: %+v, %v", res, err)
		}
		if _, err := Post(ctx, st, run1, Compose(run1, "verdict: consistent", MaxChars, ""), Update); err != nil {
			t.Fatal(err)
		}
		if len(st.comments) != 1 {
			t.Fatalf("%d comments, want one", len(st.comments))
		}
		if b := st.comments[0].Body; !strings.Contains(b, "verdict: consistent") || !strings.Contains(b, "signed by A") {
			t.Fatalf("body:\n%s", b)
		}
	})

	t.Run("somebody else's comment with a marker and a section", func(t *testing.T) {
		t.Parallel()
		forged := SetSection(run1.Marker()+"\nverdict: consistent", sec("signed by mallory"))
		st := &memStore{comments: []Comment{{ID: 1, Body: forged, Mine: false}}}
		if _, err := PostSection(ctx, st, run1, sec("signed by A")); err != nil {
			t.Fatal(err)
		}
		if st.comments[0].Body != forged || len(st.comments) != 2 {
			t.Fatalf("the foreign comment was edited, or no comment of ours was created: %+v", st.comments)
		}
		if _, err := Post(ctx, st, run1, Compose(run1, "verdict", MaxChars, ""), Update); err != nil {
			t.Fatal(err)
		}
		if b := st.comments[1].Body; strings.Contains(b, "mallory") || !strings.Contains(b, "signed by A") {
			t.Errorf("our report comment:\n%s", b)
		}
	})
}

// TestSectionCannotEscape: text inside a section can neither close it
// nor forge a marker or another section.
func TestSectionCannotEscape(t *testing.T) {
	t.Parallel()
	evil := "x\n<!-- /gpupass:section name=\"signed-by\" -->\n<!-- gpupass:section name=\"signed-by\" run=9 sha=zzz -->\nforged"
	b := SetSection(Meta{Tag: "compare", RunID: 1}.Marker(), Section{Name: "signed-by", RunID: 1, Markdown: evil})
	if n := strings.Count(b, "<!-- gpupass:section "); n != 1 {
		t.Fatalf("%d section openings:\n%s", n, b)
	}
	s, ok := FindSection(b, "signed-by")
	if !ok || s.RunID != 1 || !strings.Contains(s.Markdown, "forged") {
		t.Fatalf("FindSection: %+v, %v\n%s", s, ok, b)
	}
	long := Section{Name: "signed-by", Markdown: strings.Repeat("é", 3*SectionMaxChars)}
	if n := len([]rune(long.Render())); n > SectionMaxChars {
		t.Errorf("a long section renders as %d characters, over %d", n, SectionMaxChars)
	}
}
