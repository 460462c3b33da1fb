package forge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/gpupass/gpupass/internal/testutil"
)

var (
	monday  = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	tuesday = monday.Add(24 * time.Hour)
)

func body(m Meta, text string) string { return m.Marker() + "\n" + text }

func TestMarkerRoundTrip(t *testing.T) {
	t.Parallel()
	for _, m := range []Meta{
		{Tag: "compare", RunID: 42, CommitTime: monday, SHA: "abc123"},
		{Tag: `we"ird --> tag`, RunID: 0},
	} {
		got, ok := ParseMarker(m.Marker() + "\nworld")
		if !ok {
			t.Fatalf("marker %q not found", m.Marker())
		}
		want := m
		want.Tag = sanitizeTag(m.Tag)
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
	}
	if _, ok := ParseMarker("<!-- something else -->"); ok {
		t.Error("foreign comment parsed as marker")
	}
	// A report quoted in a reply, or a marker further down a comment, is
	// not a report.
	m := Meta{Tag: "compare", RunID: 1}
	for _, b := range []string{"@alice why red?\n\n> " + m.Marker() + "\n> report", "hello\n" + m.Marker()} {
		if _, ok := ParseMarker(b); ok {
			t.Errorf("marker not at the start parsed: %q", b)
		}
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	old := Meta{Tag: "compare", RunID: 10, CommitTime: monday}
	cur := Meta{Tag: "compare", RunID: 11, CommitTime: tuesday}
	otherTag := Meta{Tag: "audit", RunID: 99, CommitTime: tuesday.Add(time.Hour)}
	existing := []Comment{
		{ID: 1, Body: "LGTM"},
		{ID: 2, Body: body(otherTag, "audit report"), Mine: true},
		{ID: 3, Body: body(old, "old report"), Mine: true},
	}
	// Somebody else's comments carrying markers: a forged one from a far
	// newer run, and a copy of the report pasted by a person.
	forged := Meta{Tag: "compare", RunID: 1 << 40, CommitTime: tuesday.Add(24 * time.Hour)}
	foreign := append(append([]Comment{}, existing...),
		Comment{ID: 6, Body: body(forged, "✅ consistent")},
		Comment{ID: 7, Body: body(old, "old report, pasted by a person")})
	quirky := Meta{Tag: `nightly "A100" -->`, RunID: 1}
	tests := []struct {
		name     string
		existing []Comment
		meta     Meta
		body     string
		behavior Behavior
		want     Action
	}{
		{"first post", existing[:2], cur, body(cur, "new"), Update, Action{Kind: ActCreate, Reason: "no report comment with this tag yet"}},
		{"update", existing, cur, body(cur, "new"), Update, Action{Kind: ActUpdate, Update: 3, Reason: "updating the report comment in place"}},
		{"new", existing, cur, body(cur, "new"), New, Action{Kind: ActCreate, Reason: "behavior new"}},
		{"delete and new", existing, cur, body(cur, "new"), DeleteAndNew, Action{Kind: ActCreate, Delete: []int64{3}, Reason: "behavior delete-and-new"}},
		{"unchanged body skipped despite a new run id", existing, cur, body(cur, "old report"), Update, Action{Kind: ActSkip, Reason: "report unchanged"}},
		{"older pipeline does not overwrite", existing, Meta{Tag: "compare", RunID: 12, CommitTime: monday.Add(-time.Hour)}, "x", Update,
			Action{Kind: ActSkip, Reason: "a newer pipeline's report is posted (run 10, commit time 2026-03-02T09:00:00Z); not overwriting it with run 12"}},
		{"same commit, older run id", existing, Meta{Tag: "compare", RunID: 9, CommitTime: monday}, "x", DeleteAndNew,
			Action{Kind: ActSkip, Reason: "a newer pipeline's report is posted (run 10, commit time 2026-03-02T09:00:00Z); not overwriting it with run 9"}},
		{"no commit times: run ids decide", []Comment{{ID: 5, Body: body(Meta{Tag: "compare", RunID: 7}, "a"), Mine: true}}, Meta{Tag: "compare", RunID: 8}, "b", Update,
			Action{Kind: ActUpdate, Update: 5, Reason: "updating the report comment in place"}},
		{"duplicates cleaned on update", append(append([]Comment{}, existing...), Comment{ID: 4, Body: body(old, "dup"), Mine: true}), cur, "new", Update,
			Action{Kind: ActUpdate, Update: 4, Delete: []int64{3}, Reason: "updating the report comment in place"}},
		{"others' markers neither silence, get edited nor get deleted", foreign, cur, body(cur, "new"), Update,
			Action{Kind: ActUpdate, Update: 3, Reason: "updating the report comment in place"}},
		{"others' markers alone: a new report", foreign[4:], cur, body(cur, "new"), DeleteAndNew,
			Action{Kind: ActCreate, Reason: "no report comment with this tag yet"}},
		{"a tag the marker had to sanitize stays sticky", []Comment{{ID: 8, Body: body(quirky, "a"), Mine: true}}, Meta{Tag: quirky.Tag, RunID: 2}, "b", Update,
			Action{Kind: ActUpdate, Update: 8, Reason: "updating the report comment in place"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Plan(tc.existing, tc.meta, tc.body, tc.behavior)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("### report\n\n```mermaid\n")
	for b.Len() < 100000 {
		b.WriteString("line [1, 2, 3] ünïcødé\n")
	}
	b.WriteString("```\nend\n")
	md := b.String()
	got := Compose(Meta{Tag: "t", RunID: 1}, md, MaxChars-1, "artifact `gpupass-compare`")
	n := utf8.RuneCountInString(got)
	if n >= MaxChars {
		t.Errorf("%d characters, want < %d", n, MaxChars)
	}
	if n < MaxChars-200 {
		t.Errorf("%d characters: cut far more than needed", n)
	}
	if strings.Count(got, "```")%2 != 0 {
		t.Error("code fence left open")
	}
	if !strings.Contains(got, "the full report is in artifact `gpupass-compare`") || !utf8.ValidString(got) {
		t.Error("note missing or invalid UTF-8")
	}
	if short := Truncate("small", 100, ""); short != "small" {
		t.Errorf("short body changed: %q", short)
	}
}

// TestTruncateStaysWithinLimit cuts bodies that need both closers (an
// open fence inside <details>) at every position near the budget: the
// result never goes over the limit, and a backtick run inside a line (a
// quoted value) is not taken for a fence.
func TestTruncateStaysWithinLimit(t *testing.T) {
	t.Parallel()
	const limit = 1000
	for pad := range 40 {
		for _, inline := range []bool{false, true} {
			var b strings.Builder
			b.WriteString("<details>\n\n```text\n")
			b.WriteString(strings.Repeat("x", pad) + "\n")
			for b.Len() < 3*limit {
				if inline {
					b.WriteString("value \"```\" is not a number\n")
				} else {
					b.WriteString("0123456789\n")
				}
			}
			got := Truncate(b.String(), limit, "")
			if n := utf8.RuneCountInString(got); n > limit {
				t.Fatalf("pad %d inline %v: %d characters, limit %d", pad, inline, n, limit)
			}
			if !strings.Contains(got, "\n```\n\n</details>\n\n\n> ✂️ Report truncated") {
				t.Fatalf("pad %d inline %v: fence or details left open before the note:\n%s", pad, inline, got[max(0, len(got)-300):])
			}
		}
	}
}

// stubStore records what Post did, and can refuse edits.
type stubStore struct {
	comments  []Comment
	calls     []string
	updateErr error
}

func (s *stubStore) List(context.Context) ([]Comment, error) { return s.comments, nil }
func (s *stubStore) Create(_ context.Context, body string) (int64, string, error) {
	s.calls = append(s.calls, "create")
	return 99, "", nil
}
func (s *stubStore) Update(_ context.Context, id int64, body string) (string, error) {
	s.calls = append(s.calls, "update")
	return "", s.updateErr
}
func (s *stubStore) Delete(_ context.Context, id int64) error {
	s.calls = append(s.calls, "delete")
	return nil
}

// TestPostWritesBeforeDeleting: old reports go only once the new one is
// up, so a refused edit leaves the last report in place.
func TestPostWritesBeforeDeleting(t *testing.T) {
	t.Parallel()
	old := Meta{Tag: "compare", RunID: 1}
	cur := Meta{Tag: "compare", RunID: 3}
	mine := []Comment{{ID: 1, Body: body(old, "a"), Mine: true}, {ID: 2, Body: body(old, "b"), Mine: true}}
	s := &stubStore{comments: mine}
	if _, err := Post(context.Background(), s, cur, body(cur, "c"), Update); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"update", "delete"}, s.calls); d != "" {
		t.Errorf("calls (-want +got):\n%s", d)
	}
	s = &stubStore{comments: mine}
	if _, err := Post(context.Background(), s, cur, body(cur, "c"), DeleteAndNew); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"create", "delete", "delete"}, s.calls); d != "" {
		t.Errorf("calls (-want +got):\n%s", d)
	}
	s = &stubStore{comments: mine, updateErr: errors.New("422")}
	if _, err := Post(context.Background(), s, cur, body(cur, "c"), Update); err == nil {
		t.Fatal("refused edit reported as success")
	}
	if d := cmp.Diff([]string{"update"}, s.calls); d != "" {
		t.Errorf("a refused edit deleted reports: calls %v", s.calls)
	}
}

// lossyStore is a forge whose first creates are answered with an
// UncertainError; kept says how the forge stored such a create's body
// ("" when it did not).
type lossyStore struct {
	comments []Comment
	lost     int
	kept     func(body string) string
	foreign  bool // kept creates show as another account's
	listErr  error
	calls    []string
}

func (s *lossyStore) List(context.Context) ([]Comment, error) {
	if len(s.calls) > 0 && s.listErr != nil {
		return nil, s.listErr
	}
	s.calls = append(s.calls, "list")
	return append([]Comment(nil), s.comments...), nil
}

func (s *lossyStore) Create(_ context.Context, body string) (int64, string, error) {
	s.calls = append(s.calls, "create")
	if s.lost > 0 {
		s.lost--
		if b := s.kept(body); b != "" {
			s.comments = append(s.comments, Comment{ID: int64(len(s.comments) + 1), Body: b, Mine: !s.foreign, URL: "kept"})
		}
		return 0, "", fmt.Errorf("creating the report comment: %w", &UncertainError{Status: "502 Bad Gateway"})
	}
	s.comments = append(s.comments, Comment{ID: int64(len(s.comments) + 1), Body: body, Mine: true})
	return int64(len(s.comments)), "", nil
}

func (s *lossyStore) Update(_ context.Context, id int64, body string) (string, error) {
	s.calls = append(s.calls, "update")
	s.comments[id-1].Body = body
	return "", nil
}

func (s *lossyStore) Delete(context.Context, int64) error {
	s.calls = append(s.calls, "delete")
	return nil
}

// TestPostAfterUncertainCreate: after a create that may have been
// applied, Post takes as the report only a comment of its own, new since
// it listed, with this run's marker, fixes its body if the forge changed
// it, and posts again only when there is none.
func TestPostAfterUncertainCreate(t *testing.T) {
	t.Parallel()
	cur := Meta{Tag: "compare", RunID: 3}
	other := Meta{Tag: "audit", RunID: 3}
	asSent := func(b string) string { return b }
	dropped := func(string) string { return "" }
	tests := []struct {
		name      string
		pre       []Comment
		behavior  Behavior
		kept      func(string) string
		foreign   bool
		wantID    int64
		wantURL   string
		wantCalls []string
		wantLast  []string
	}{
		{"kept as sent", nil, Update, asSent, false, 1, "kept", []string{"list", "create", "list"}, []string{body(cur, "c")}},
		{"kept with other line endings", nil, Update, func(b string) string { return strings.ReplaceAll(b, "\n", "\r\n") }, false, 1, "kept",
			[]string{"list", "create", "list", "update"}, []string{body(cur, "c")}},
		{"kept under another tag is not ours", nil, Update, func(string) string { return body(other, "c") }, false, 2, "",
			[]string{"list", "create", "list", "create"}, []string{body(other, "c"), body(cur, "c")}},
		{"same run's earlier report is not the new one", []Comment{{ID: 1, Body: body(cur, "b"), Mine: true}}, New, dropped, false, 2, "",
			[]string{"list", "create", "list", "create"}, []string{body(cur, "b"), body(cur, "c")}},
		{"another account's comment is not ours", nil, Update, asSent, true, 2, "",
			[]string{"list", "create", "list", "create"}, []string{body(cur, "c"), body(cur, "c")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &lossyStore{comments: tc.pre, lost: 1, kept: tc.kept, foreign: tc.foreign}
			res, err := Post(context.Background(), s, cur, body(cur, "c"), tc.behavior)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != "created" || res.ID != tc.wantID || res.URL != tc.wantURL {
				t.Errorf("result %+v, want comment %d created at %q", res, tc.wantID, tc.wantURL)
			}
			if d := cmp.Diff(tc.wantCalls, s.calls); d != "" {
				t.Errorf("calls (-want +got):\n%s", d)
			}
			var got []string
			for _, c := range s.comments {
				got = append(got, c.Body)
			}
			if d := cmp.Diff(tc.wantLast, got); d != "" {
				t.Errorf("comments (-want +got):\n%s", d)
			}
		})
	}

	// A newer pipeline's report that appeared meanwhile is never
	// followed by an older one.
	newer := Meta{Tag: "compare", RunID: 4}
	s := &lossyStore{lost: 1, kept: func(string) string { return body(newer, "d") }}
	res, err := Post(context.Background(), s, cur, body(cur, "c"), DeleteAndNew)
	if err != nil || res.Action != "skipped" || !strings.Contains(res.Reason, "newer pipeline") {
		t.Errorf("result %+v, %v: want skipped for the newer pipeline's report", res, err)
	}
	if d := cmp.Diff([]string{"list", "create", "list"}, s.calls); d != "" {
		t.Errorf("calls (-want +got):\n%s", d)
	}

	s = &lossyStore{lost: 1, kept: dropped, listErr: errors.New("listing comments: 503 Service Unavailable")}
	_, err = Post(context.Background(), s, cur, body(cur, "c"), Update)
	for _, want := range []string{"creating the report comment", "502 Bad Gateway", "looking whether the report was created anyway: listing comments: 503"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// flaky answers with the queued faults first, then 200 with the request
// body echoed.
type flaky struct {
	mu     sync.Mutex
	faults []func(http.ResponseWriter)
	bodies []string
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, string(b))
	var fault func(http.ResponseWriter)
	if len(f.faults) > 0 {
		fault, f.faults = f.faults[0], f.faults[1:]
	}
	f.mu.Unlock()
	if fault != nil {
		fault(w)
		return
	}
	w.Write(b)
}

func TestRetry(t *testing.T) {
	t.Parallel()
	status := func(code int, hdr, msg string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			if hdr != "" {
				w.Header().Set("Retry-After", hdr)
			}
			w.WriteHeader(code)
			io.WriteString(w, msg)
		}
	}
	tests := []struct {
		name   string
		method string
		faults []func(http.ResponseWriter)
		// wantStatus 0: an *UncertainError instead of an answer.
		wantStatus int
		wantTries  int
		wantWaits  []time.Duration
	}{
		{"ok", "POST", nil, 200, 1, nil},
		{"5xx then ok", "PUT", []func(http.ResponseWriter){status(502, "", ""), status(503, "", "")}, 200, 3, []time.Duration{time.Second, 2 * time.Second}},
		{"idempotent PATCH retried after 502", "PATCH", []func(http.ResponseWriter){status(502, "", "")}, 200, 2, []time.Duration{time.Second}},
		{"secondary rate limit message", "POST", []func(http.ResponseWriter){status(403, "", `{"message":"You have exceeded a secondary rate limit"}`)}, 200, 2, []time.Duration{time.Second}},
		{"retry-after honoured", "POST", []func(http.ResponseWriter){status(429, "7", "")}, 200, 2, []time.Duration{7 * time.Second}},
		{"plain 403 not retried", "POST", []func(http.ResponseWriter){status(403, "", `{"message":"Resource not accessible by integration"}`)}, 403, 1, nil},
		{"gives up after attempts", "DELETE", []func(http.ResponseWriter){status(500, "", ""), status(500, "", ""), status(500, "", ""), status(500, "", "")}, 500, 4, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
		{"too long a wait is not slept", "POST", []func(http.ResponseWriter){status(403, "3600", "")}, 403, 1, nil},
		{"POST not resent after 502", "POST", []func(http.ResponseWriter){status(502, "", `{"message":"Server Error"}`)}, 0, 1, nil},
		{"POST not resent after 503 with Retry-After", "POST", []func(http.ResponseWriter){status(503, "1", "")}, 0, 1, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{faults: tc.faults}
			srv := httptest.NewServer(f)
			defer srv.Close()
			var waits []time.Duration
			rt := &Retry{Base: srv.Client().Transport, Sleep: func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }}
			c := &http.Client{Transport: rt}
			req, err := http.NewRequest(tc.method, srv.URL, strings.NewReader("payload"))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(req)
			if tc.wantStatus == 0 {
				if !Uncertain(err) || !strings.Contains(fmt.Sprint(err), "may have applied it") {
					t.Errorf("error %v, want one saying the POST may have been applied", err)
				}
				if err == nil {
					resp.Body.Close()
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.wantStatus {
					t.Errorf("status %d, want %d", resp.StatusCode, tc.wantStatus)
				}
				if tc.wantStatus == 200 && string(got) != "payload" {
					t.Errorf("body %q: request body not replayed", got)
				}
			}
			if len(f.bodies) != tc.wantTries {
				t.Errorf("%d tries, want %d", len(f.bodies), tc.wantTries)
			}
			for _, b := range f.bodies {
				if b != "payload" {
					t.Errorf("try sent body %q", b)
				}
			}
			checkWaits(t, tc.wantWaits, waits)
		})
	}
}

// TestRetryAttemptTimeout: AttemptTimeout bounds each try, not the waits
// between tries (a Retry-After longer than it is still honoured), and a
// returned body stays readable until it is closed.
func TestRetryAttemptTimeout(t *testing.T) {
	t.Parallel()
	post := func(bound time.Duration, payload string) (string, int, error) {
		f := &flaky{faults: []func(http.ResponseWriter){func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}}}
		srv := httptest.NewServer(f)
		defer srv.Close()
		c := &http.Client{Transport: &Retry{Base: srv.Client().Transport, AttemptTimeout: bound}}
		resp, err := c.Post(srv.URL, "text/plain", strings.NewReader(payload))
		if err != nil {
			return "", len(f.bodies), err
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		return string(got), len(f.bodies), err
	}
	if got, tries, err := post(500*time.Millisecond, "payload"); err != nil || got != "payload" || tries != 2 {
		t.Errorf("a 1 s Retry-After with a 500 ms try bound: %q after %d tries, %v", got, tries, err)
	}
	// A body too big to sit in the transport's buffers when the try
	// returns: reading it needs the try's context alive.
	big := strings.Repeat("payload ", 512<<10)
	if got, _, err := post(time.Minute, big); err != nil || got != big {
		t.Errorf("big body: %d of %d bytes read, %v", len(got), len(big), err)
	}

	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hang.Close()
	c := &http.Client{Transport: &Retry{Base: hang.Client().Transport, AttemptTimeout: 300 * time.Millisecond}}
	start := time.Now()
	if _, err := c.Get(hang.URL); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hung try: %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Errorf("hung try took %v", d)
	}
}

// checkWaits: the back-off is jittered, so each wait is drawn from
// [want, 3×want] (the first from [Backoff, 3×Backoff], each interval
// twice the last); a Retry-After wait is exactly its want.
func checkWaits(t *testing.T, want, got []time.Duration) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("waits %v, want %d of them (about %v)", got, len(want), want)
	}
	for i := range want {
		if got[i] < want[i] || got[i] > 3*want[i] {
			t.Errorf("wait %d is %v, want within [%v, %v] (all: %v)", i+1, got[i], want[i], 3*want[i], got)
		}
	}
}

// TestRetryWaitsJitteredAndCapped: forge clients that fail together
// (every CI job of a project when the forge is down) must not retry in
// lockstep, and no wait may pass MaxWait. The doubling this replaced
// slept 1s, 2s, 4s … for every client alike, past MaxWait (64s on the
// 7th try) when connections were refused.
func TestRetryWaitsJitteredAndCapped(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(&flaky{})
	defer srv.Close()
	schedule := func() []time.Duration {
		var waits []time.Duration
		c := &http.Client{Transport: &Retry{Base: testutil.RefuseDials(t, srv, func(int32) bool { return true }), Attempts: 9, MaxWait: 10 * time.Second,
			Sleep: func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }}}
		if _, err := c.Get(srv.URL); err == nil {
			t.Fatal("every dial refused, yet the GET succeeded")
		}
		return waits
	}
	a, b := schedule(), schedule()
	if len(a) != 8 {
		t.Fatalf("%d waits for 9 attempts: %v", len(a), a)
	}
	if slices.Equal(a, b) {
		t.Errorf("two clients waited alike, %v: no jitter", a)
	}
	for _, d := range append(a, b...) {
		if d < time.Second || d > 10*time.Second {
			t.Errorf("a wait of %v, want within [1s (Backoff), 10s (MaxWait)]: %v", d, a)
		}
	}
}

// TestRetryUnsent: a POST whose connection is refused never reached the
// forge, so it is sent again; when every try is refused, the error is the
// connection's, not one that says the POST may have been applied.
func TestRetryUnsent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		refused   int32
		wantTries int
		wantWaits []time.Duration
	}{
		{"refused once", 1, 1, []time.Duration{time.Second}},
		{"always refused", 4, 0, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &flaky{}
			srv := httptest.NewServer(f)
			defer srv.Close()
			var waits []time.Duration
			c := &http.Client{Transport: &Retry{Base: testutil.RefuseDials(t, srv, func(n int32) bool { return n <= tc.refused }), Sleep: func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }}}
			resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("payload"))
			if tc.wantTries > 0 {
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(got) != "payload" {
					t.Errorf("body %q", got)
				}
			} else {
				var op *net.OpError
				if !errors.As(err, &op) || op.Op != "dial" || Uncertain(err) {
					t.Errorf("error %v, want the refused connection's", err)
				}
			}
			if len(f.bodies) != tc.wantTries {
				t.Errorf("%d tries reached the server, want %d", len(f.bodies), tc.wantTries)
			}
			checkWaits(t, tc.wantWaits, waits)
		})
	}
}

// TestRetryUncertainAfterSend: a POST whose connection breaks or times
// out once the request is sent may have been applied: it is not sent
// again, and the error says so.
func TestRetryUncertainAfterSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		handle  func(http.ResponseWriter, *http.Request)
		timeout time.Duration
	}{
		{"connection closed after the request", func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}, 0},
		{"no answer within the try's bound", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var tries atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				tries.Add(1)
				tc.handle(w, r)
			}))
			defer srv.Close()
			c := &http.Client{Transport: &Retry{Base: srv.Client().Transport, AttemptTimeout: tc.timeout, Sleep: func(context.Context, time.Duration) error { return nil }}}
			resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("payload"))
			if err == nil {
				resp.Body.Close()
			}
			if !Uncertain(err) || !strings.Contains(err.Error(), "the request was sent but no answer came") {
				t.Errorf("error %v, want one saying the POST may have been applied", err)
			}
			if n := tries.Load(); n != 1 {
				t.Errorf("the POST reached the server %d times, want once", n)
			}
		})
	}
}
