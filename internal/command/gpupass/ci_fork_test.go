package gpupass_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	"github.com/gpupass/gpupass/internal/command/gpupass"
)

// TestCIStepCompareOnForkPR is a pull request from a fork: GitHub gives
// the workflow a read-only token, so the API refuses the comment with 403.
// The step fails with one error that says why and what to do, never the
// token, and the report still reaches the outputs and the step summary.
func TestCIStepCompareOnForkPR(t *testing.T) {
	t.Parallel()
	const token = "ghs-fork-readonly-77e1"
	var calls atomic.Int32
	gh := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte(`{"message":"Resource not accessible by integration","documentation_url":"https://docs.github.com/rest"}`))
	}))
	defer gh.Close()

	dir := t.TempDir()
	for name, delta := range map[string]float64{"us.jsonl": 0, "eu.jsonl": 0.001} {
		var b strings.Builder
		for step := 0; step <= 50; step += 10 {
			fmt.Fprintf(&b, "{\"step\":%d,\"loss\":%g}\n", step, 3-float64(step)/50+delta)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	event := filepath.Join(dir, "event.json")
	os.WriteFile(event, []byte(`{"pull_request":{"number":7,"head":{"sha":"0123456789abcdef0123456789abcdef01234567","repo":{"fork":true}}}}`), 0o644)
	env := ciEnv("github", dir)
	env["GITHUB_EVENT_NAME"] = "pull_request"
	env["GITHUB_EVENT_PATH"] = event
	env["GITHUB_REPOSITORY"] = "acme/train"
	env["GITHUB_API_URL"] = gh.URL
	// `gpupass -o github compare`, as the action runs it.
	o := gpupass.CompareOptions{Runs: "us=" + filepath.Join(dir, "us.jsonl") + " eu=" + filepath.Join(dir, "eu.jsonl"),
		Tolerance: "5%", FailOnDivergence: true, Tag: "compare", CommentBehavior: "update", Post: "auto", ReportDir: filepath.Join(dir, "rep"),
		GitHubToken: token, Getenv: func(k string) string { return env[k] }, Output: "github",
		// Posting: the forge clients linked in, as cmd/gpupass runs it.
		Poster: forgepost.Poster{}}
	var out, log bytes.Buffer
	o.ErrOut = &log
	err := gpupass.RunCompare(context.Background(), &o, &out)
	if code := gpupass.ExitCode(err); code != gpupass.ExitUsage {
		t.Fatalf("exit %d (%v), want %d", code, err, gpupass.ExitUsage)
	}
	for _, want := range []string{"403", "pull-requests: write", "forks"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if calls.Load() == 0 {
		t.Errorf("nothing reached the GitHub API")
	}
	for file, want := range map[string]string{"output": "verdict<<", "summary": "gpupass compare: consistent"} {
		b, _ := os.ReadFile(filepath.Join(dir, file))
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q:\n%s", file, want, b)
		}
	}
	if all := out.String() + log.String() + err.Error(); strings.Contains(all, token) {
		t.Errorf("the token reached the output")
	}
}
