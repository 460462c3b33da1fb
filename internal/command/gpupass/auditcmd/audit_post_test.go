package auditcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
)

// prComments serves GitHub's issue comments API for acme/train#7 to one
// token, whose comments are the Actions bot's.
type prComments struct {
	token  string
	mu     sync.Mutex
	bodies []string
}

func (p *prComments) handler() http.Handler {
	mux := http.NewServeMux()
	item := func(id int, body string) map[string]any {
		return map[string]any{"id": id, "body": body, "user": map[string]any{"login": "github-actions[bot]", "type": "Bot"}}
	}
	authed := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer "+p.token {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return false
		}
		return true
	}
	mux.HandleFunc("GET /api/v3/user", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"message":"Resource not accessible by integration"}`, http.StatusForbidden)
	})
	mux.HandleFunc("GET /api/v3/repos/acme/train/issues/7/comments", func(w http.ResponseWriter, r *http.Request) {
		if !authed(w, r) {
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		list := []map[string]any{}
		for i, b := range p.bodies {
			list = append(list, item(i+1, b))
		}
		json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("POST /api/v3/repos/acme/train/issues/7/comments", func(w http.ResponseWriter, r *http.Request) {
		if !authed(w, r) {
			return
		}
		var c struct{ Body string }
		json.NewDecoder(r.Body).Decode(&c)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.bodies = append(p.bodies, c.Body)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(item(len(p.bodies), c.Body))
	})
	mux.HandleFunc("PATCH /api/v3/repos/acme/train/issues/comments/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !authed(w, r) {
			return
		}
		var c struct{ Body string }
		json.NewDecoder(r.Body).Decode(&c)
		id, _ := strconv.Atoi(r.PathValue("id"))
		p.mu.Lock()
		defer p.mu.Unlock()
		if id < 1 || id > len(p.bodies) {
			http.NotFound(w, r)
			return
		}
		p.bodies[id-1] = c.Body
		json.NewEncoder(w).Encode(item(id, c.Body))
	})
	return mux
}

// TestAuditKeySignedSectionInPRComment: the audit step of a pull request,
// signed with a key, with no compare report posted yet, starts the
// sticky report comment with who signed and the verify command (the
// key's public half, never the key, its path or its password, nor the
// token); run again, it leaves the one comment as it is. Outside a CI
// step (-o text) nothing is posted.
func TestAuditKeySignedSectionInPRComment(t *testing.T) {
	t.Parallel()
	dir, _ := auditFixture(t)
	const token = "ghs-unit-secret-0b7e"
	srv := &prComments{token: token}
	ts := httptest.NewServer(srv.handler())
	defer ts.Close()
	event := filepath.Join(dir, "event.json")
	if err := os.WriteFile(event, []byte(`{"pull_request":{"number":7,"head":{"sha":"0123456789abcdef0123456789abcdef01234567"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"COSIGN_PASSWORD": "gpupass-test", "GITHUB_ACTIONS": "true", "GITHUB_EVENT_PATH": event, "GITHUB_REPOSITORY": "acme/train",
		"GITHUB_API_URL": ts.URL + "/api/v3", "GITHUB_RUN_ID": "41", "GITHUB_TOKEN": token}
	audit := func(format string) string {
		var out, errOut bytes.Buffer
		err := RunAudit(context.Background(), AuditOptions{
			AllocationID: "alloc-7f3a", Out: filepath.Join(dir, "audit-report.zip"), RunFile: filepath.Join(dir, "run.json"),
			Key: filepath.Join(dir, "cosign.key"), Output: output.Format(format), Getenv: func(k string) string { return env[k] },
			ErrOut: &errOut, PostTo: PostFlags{Post: "auto", Tag: "compare", Poster: forgepost.Poster{}},
		}, &out)
		if err != nil {
			t.Fatalf("audit -o %s: %v\n%s", format, err, errOut.String())
		}
		return errOut.String()
	}
	audit("text")
	if len(srv.bodies) != 0 {
		t.Fatalf("audit -o text posted %q", srv.bodies)
	}
	log := audit("github")
	if !strings.Contains(log, "report comment: signed-by section created") {
		t.Errorf("the step log does not say the section was posted:\n%s", log)
	}
	audit("github")
	if len(srv.bodies) != 1 {
		t.Fatalf("%d comments after two audits, want one: %q", len(srv.bodies), srv.bodies)
	}
	b := srv.bodies[0]
	if !strings.HasPrefix(b, `<!-- gpupass:report tag="compare" run=41 `) {
		t.Errorf("the comment does not start with the report's marker:\n%s", b)
	}
	want := "```sh\ngpupass audit verify " + filepath.Join(dir, "audit-report.zip") + " --key cosign.pub\n```"
	if !strings.Contains(b, want) || !strings.Contains(b, "Signed with the pipeline's cosign key") {
		t.Errorf("the comment lacks %q:\n%s", want, b)
	}
	for _, secret := range []string{token, "gpupass-test", "cosign.key", "ENCRYPTED"} {
		if strings.Contains(b, secret) {
			t.Errorf("the comment holds %q:\n%s", secret, b)
		}
	}
	// The command, as pasted where cosign.pub is.
	var vout bytes.Buffer
	if err := RunAuditVerify(context.Background(), AuditVerifyOptions{Path: filepath.Join(dir, "audit-report.zip"), Key: filepath.Join(dir, "cosign.pub"), Getenv: func(k string) string { return env[k] }}, &vout); err != nil {
		t.Errorf("the comment's verify command: %v\n%s", err, vout.String())
	}
}

// TestAuditPostFlag: a --post that is no destination is a usage error
// naming the flag, before anything is signed.
func TestAuditPostFlag(t *testing.T) {
	t.Parallel()
	dir, getenv := auditFixture(t)
	err := RunAudit(context.Background(), AuditOptions{AllocationID: "alloc-7f3a", Out: filepath.Join(dir, "a.zip"), RunFile: filepath.Join(dir, "run.json"),
		Key: filepath.Join(dir, "cosign.key"), Getenv: getenv, PostTo: PostFlags{Post: "slack"}}, &bytes.Buffer{})
	if gpupass.ExitCode(err) != gpupass.ExitUsage || !strings.Contains(err.Error(), `--post "slack"`) {
		t.Fatalf("exit %d, %v; want a usage error naming --post", gpupass.ExitCode(err), err)
	}
	if _, serr := os.Stat(filepath.Join(dir, "a.zip")); serr == nil {
		t.Errorf("the zip was written despite the bad flag")
	}
}
