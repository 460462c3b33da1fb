package ci_test

import (
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/testutil"
)

// What the webhook receivers of docs/webhooks.md make of a verified
// group.ended event, in Go: the loop's end-to-end tests start the forge's
// workflow or pipeline with these, and TestDocsReceiversMatch runs the
// docs' Python receivers on the same events and wants the same.

// dispatchPayload is the client_payload of the repository_dispatch a
// receiver serving repo sends: the event as it came, without a ci of
// another repository.
func dispatchPayload(body []byte, repo string) (json.RawMessage, error) {
	var ev map[string]any
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, err
	}
	if ci, _ := ev["ci"].(map[string]any); ci["repository"] != repo {
		delete(ev, "ci")
		return json.Marshal(ev)
	}
	return json.RawMessage(body), nil
}

// triggerVariables are the variables of the pipeline a receiver serving
// GitLab project projectID triggers: the group, and the merge request
// when the event's ci is this project's.
func triggerVariables(body []byte, projectID int) (map[string]string, error) {
	var ev struct {
		Group string `json:"group"`
		CI    *struct {
			Forge       string `json:"forge"`
			ProjectID   string `json:"project_id"`
			PullRequest int64  `json:"pull_request"`
		} `json:"ci"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, err
	}
	vars := map[string]string{"GPUPASS_GROUP": ev.Group}
	if c := ev.CI; c != nil && c.Forge == "gitlab" && c.ProjectID == strconv.Itoa(projectID) && c.PullRequest > 0 {
		vars["GPUPASS_MERGE_REQUEST"] = strconv.FormatInt(c.PullRequest, 10)
	}
	return vars, nil
}

// receiverHarness runs the docs' receiver functions (dispatch, trigger)
// with urllib's urlopen replaced by one that records each request, on
// the event in argv[2], for the repository and projects named after it.
const receiverHarness = `
import json, sys, urllib.parse, urllib.request
captured = []
class _Resp:
    def close(self): pass
def _urlopen(req, *a, **k):
    captured.append({"url": req.full_url, "data": req.data.decode(), "auth": req.get_header("Authorization") or ""})
    return _Resp()
urllib.request.urlopen = _urlopen
exec(open(sys.argv[1]).read())
body = open(sys.argv[2], "rb").read()
dispatch(body, "gh-token", sys.argv[3])
trigger(body, "trigger-token", int(sys.argv[4]))
json.dump(captured, sys.stdout)
`

// TestDocsReceiversMatch runs the Python receivers docs/webhooks.md shows
// (dispatch for GitHub, trigger for GitLab) on broker events, with and
// without a ci of the receiver's own repository or project, and wants
// what the loop's end-to-end tests hand act and gitlab-ci-local
// (dispatchPayload, triggerVariables): a user who pastes the docs'
// receiver gets the loop those tests ran.
func TestDocsReceiversMatch(t *testing.T) {
	t.Parallel()
	python := testutil.Tool(t, "python3")
	doc, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "docs", "webhooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	var code []string
	for _, m := range regexp.MustCompile("(?s)```python\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		if strings.Contains(m[1], "def dispatch(") || strings.Contains(m[1], "def trigger(") {
			code = append(code, m[1])
		}
	}
	if len(code) != 2 {
		t.Fatalf("docs/webhooks.md shows %d receiver functions (dispatch, trigger), want 2", len(code))
	}
	dir := t.TempDir()
	receiver := filepath.Join(dir, "receiver.py")
	if err := os.WriteFile(receiver, []byte(strings.Join(code, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	runs := `"runs":[{"allocation":"alloc-ce81ac14","region":"us-west-2","name":"bert-us-west-2","state":"succeeded","reason":"","links":{}}]`
	for _, tc := range []struct {
		name, event, repo string
		project           int
	}{
		{"github ci of the repository", `{"event":"group.ended","delivery":"dlv-1","group":"group-9c76e1076821a9ec","ended_at":"2026-12-06T18:04:32Z",` + runs +
			`,"ci":{"forge":"github","repository":"acme/train","pull_request":7,"sha":"8a3f9b2","run_url":"https://github.com/acme/train/actions/runs/1"}}`, "acme/train", 42},
		{"github ci of another repository", `{"event":"group.ended","delivery":"dlv-2","group":"group-9c76e1076821a9ec","ended_at":"2026-12-06T18:04:32Z",` + runs +
			`,"ci":{"forge":"github","repository":"evil/other","pull_request":7}}`, "acme/train", 42},
		{"gitlab ci of the project", `{"event":"group.ended","delivery":"dlv-3","group":"group-9c76e1076821a9ec","ended_at":"2026-12-06T18:04:32Z",` + runs +
			`,"ci":{"forge":"gitlab","repository":"acme/train","pull_request":3,"project_id":"42"}}`, "acme/train", 42},
		{"gitlab ci of another project", `{"event":"group.ended","delivery":"dlv-4","group":"group-9c76e1076821a9ec","ended_at":"2026-12-06T18:04:32Z",` + runs +
			`,"ci":{"forge":"gitlab","repository":"acme/train","pull_request":3,"project_id":"42"}}`, "acme/train", 43},
		{"no ci", `{"event":"group.ended","delivery":"dlv-5","group":"group-9c76e1076821a9ec","ended_at":"2026-12-06T18:04:32Z",` + runs + `}`, "acme/train", 42},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			event := filepath.Join(t.TempDir(), "event.json")
			if err := os.WriteFile(event, []byte(tc.event), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(python, "-c", receiverHarness, receiver, event, tc.repo, strconv.Itoa(tc.project)).Output()
			if ee, ok := err.(*exec.ExitError); ok {
				t.Fatalf("the docs' receivers: %v\n%s", err, ee.Stderr)
			} else if err != nil {
				t.Fatal(err)
			}
			var calls []struct{ URL, Data, Auth string }
			if err := json.Unmarshal(out, &calls); err != nil || len(calls) != 2 {
				t.Fatalf("the docs' receivers made %s, %v; want a dispatch and a trigger", out, err)
			}
			// GitHub: the dispatch.
			if want := "https://api.github.com/repos/" + tc.repo + "/dispatches"; calls[0].URL != want || calls[0].Auth != "Bearer gh-token" {
				t.Errorf("dispatch to %s (auth %q), want %s", calls[0].URL, calls[0].Auth, want)
			}
			var sent struct {
				EventType     string         `json:"event_type"`
				ClientPayload map[string]any `json:"client_payload"`
			}
			if err := json.Unmarshal([]byte(calls[0].Data), &sent); err != nil || sent.EventType != "gpupass-group-ended" {
				t.Fatalf("dispatch body %s, %v; want event_type gpupass-group-ended", calls[0].Data, err)
			}
			want, err := dispatchPayload([]byte(tc.event), tc.repo)
			if err != nil {
				t.Fatal(err)
			}
			var wantPayload map[string]any
			json.Unmarshal(want, &wantPayload)
			if diff := cmp.Diff(wantPayload, sent.ClientPayload); diff != "" {
				t.Errorf("the docs' client_payload differs from the tests' (-tests +docs):\n%s", diff)
			}
			// GitLab: the trigger.
			if want := "https://gitlab.example.com/api/v4/projects/" + strconv.Itoa(tc.project) + "/trigger/pipeline"; calls[1].URL != want {
				t.Errorf("trigger to %s, want %s", calls[1].URL, want)
			}
			form, err := url.ParseQuery(calls[1].Data)
			if err != nil || form.Get("token") != "trigger-token" || form.Get("ref") != "main" {
				t.Fatalf("trigger form %s, %v", calls[1].Data, err)
			}
			got := map[string]string{}
			for k := range form {
				if name, ok := strings.CutPrefix(k, "variables["); ok {
					got[strings.TrimSuffix(name, "]")] = form.Get(k)
				}
			}
			wantVars, err := triggerVariables([]byte(tc.event), tc.project)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantVars, got); diff != "" {
				t.Errorf("the docs' trigger variables differ from the tests' (-tests +docs):\n%s", diff)
			}
		})
	}
}
