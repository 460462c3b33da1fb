package ui_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/ui"
)

// BenchmarkLogin measures one dashboard login (form to cookie, the
// token lookup free) while the dashboard holds its default limit of
// 1,000 sessions: every login then ends one (issue #31's session
// limits), so this is the eviction's cost per login.
func BenchmarkLogin(b *testing.B) {
	tokens := map[string]ui.Token{}
	for i := range ui.DefaultMaxSessions {
		role := "read"
		if i%10 == 0 {
			role = "admin"
		}
		tokens[fmt.Sprintf("gpp_%04d", i)] = ui.Token{ID: fmt.Sprintf("tok-%04d", i), Role: role, Regions: []string{"*"}}
	}
	s, err := ui.New(ui.Config{API: http.NotFoundHandler(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Lookup: func(_ context.Context, secret string) (ui.Token, error) { return tokens[secret], nil }})
	if err != nil {
		b.Fatal(err)
	}
	login := func(i int) {
		secret := fmt.Sprintf("gpp_%04d", i%ui.DefaultMaxSessions)
		r := httptest.NewRequest("POST", "/ui/login", strings.NewReader(url.Values{"token": {secret}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.RemoteAddr = fmt.Sprintf("10.0.%d.%d:4000", i/250%250, i%250)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != http.StatusSeeOther {
			b.Fatalf("login %d: %d %s", i, w.Code, w.Body)
		}
	}
	// Every token once, then each of the first tokens past its own limit.
	for i := range ui.DefaultMaxSessions {
		login(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		login(i * 10) // the admins: past MaxSessions, each ends the oldest admin session
	}
}
