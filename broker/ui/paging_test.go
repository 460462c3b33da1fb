package ui_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
)

var (
	nextRE    = regexp.MustCompile(`<a href="([^"]+)" id="next-page">`)
	nodeRowRE = regexp.MustCompile(`<tr class="node" data-region="([^"]+)">\s*<td><code>([^<]+)</code>`)
	runRowRE  = regexp.MustCompile(`<a href="/ui/runs/([^"]+)">`)
)

// TestDashboardPaging follows the nodes and runs pages' "next" links to
// the end as a us-only reader: every node and run of its scope shows
// exactly once, none of another region, runs past the first page are
// reached through the API's page tokens, and an altered page token in
// the link is refused with a page that says what to do.
func TestDashboardPaging(t *testing.T) {
	t.Parallel()
	db := brokertest.NewDB(t, "sqlite")
	s := db.Open(t)
	ctx := context.Background()
	now := time.Now()
	const nodes, runs = 250, 130
	wantNodes, wantRuns := map[string]bool{}, map[string]bool{}
	for i := range nodes {
		id, region := fmt.Sprintf("agt-ui%03d", i), []string{"us-west-2", "eu-central-1", "us-east-1"}[i%3]
		if _, _, err := s.EnrollAgent(ctx, store.Agent{ID: id, KeyFingerprint: id, PublicKeyPEM: []byte("k"), EnrolledAt: now, Labels: store.Labels{Region: region}}, nil); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(region, "us-") {
			wantNodes[id] = true
		}
	}
	for i := range runs {
		id, region := fmt.Sprintf("alloc-ui%04d", i), []string{"us-west-2", "eu-central-1"}[i%2]
		a := store.Alloc{ID: id, Name: "ui", Region: region, State: store.AllocSucceeded, SpecJSON: []byte("{}"), CreatedAt: now.Add(time.Duration(i) * time.Second)}
		if err := s.(store.Runs).CreateAlloc(ctx, a); err != nil {
			t.Fatal(err)
		}
		if region == "us-west-2" {
			wantRuns[id] = true
		}
	}
	b := brokertest.Start(t, db, broker.Config{OfflineAfter: time.Hour})
	us := newBrowser(t, b.URL)
	us.login(b.Token(t, store.RoleRead, "us-*"))

	follow := func(start string, row *regexp.Regexp, id int) (seen map[string]int, pages int, first string) {
		seen = map[string]int{}
		for page := start; page != ""; pages++ {
			if pages > 20 {
				t.Fatalf("%s: paging does not end", start)
			}
			resp, body := us.do("GET", page, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %s", page, resp.Status)
			}
			for _, m := range row.FindAllStringSubmatch(body, -1) {
				if id == 2 && !strings.HasPrefix(m[1], "us-") {
					t.Errorf("%s: a node of %s on a us-only reader's page", page, m[1])
				}
				seen[m[id]]++
			}
			page = ""
			if m := nextRE.FindStringSubmatch(body); m != nil {
				page = html.UnescapeString(m[1])
				if first == "" {
					first = page
				}
			}
		}
		return seen, pages, first
	}
	check := func(what string, want map[string]bool, seen map[string]int) {
		for id, n := range seen {
			if !want[id] || n != 1 {
				t.Errorf("%s: %s shown %d times, in scope %v; want each of the scope's once", what, id, n, want[id])
			}
		}
		if len(seen) != len(want) {
			t.Errorf("%s: %d shown, want %d", what, len(seen), len(want))
		}
	}
	seen, pages, next := follow("/ui/nodes", nodeRowRE, 2)
	check("nodes", wantNodes, seen)
	if pages != 2 {
		t.Errorf("%d node pages for %d nodes, want 2 of 100", pages, len(wantNodes))
	}
	seen, pages, _ = follow("/ui/runs", runRowRE, 1)
	check("runs", wantRuns, seen)
	if pages != 2 {
		t.Errorf("%d run pages for %d runs, want 2 of 50", pages, len(wantRuns))
	}

	// An altered token in the link is refused, not served from some
	// other place.
	i := strings.Index(next, "after=") + len("after=") + 10
	bad := next[:i] + string("AB"[strings.IndexByte("A", next[i])+1]) + next[i+1:]
	resp, body := us.do("GET", bad, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "page_token was altered") || !strings.Contains(body, "without page_token") {
		t.Errorf("nodes page with an altered page token: %s\n%s", resp.Status, tail(body, 800))
	}
}
