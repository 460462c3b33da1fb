package gpupass_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/report"
)

// slowAgent works each run it is given over the real agent protocol:
// running, steps 1..10 logged (loss scale*2/step), then it holds the run
// running until release is closed, logs steps 11..20 and succeeds.
func slowAgent(t *testing.T, url, tok string, n brokertest.NodeSpec, scale float64, release <-chan struct{}) {
	t.Helper()
	protocolAgent(t, url, tok, n, func(ctx context.Context, c *client.RunClients, agentID string, as *gpupassv1.Assignment) {
		update := func(st gpupassv1.AllocState, last uint64) {
			_, _ = c.Work.UpdateAllocation(ctx, connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: agentID, AllocId: as.AllocId,
				FencingToken: as.FencingToken, State: st, Attempts: 1, LastSeq: last}))
		}
		upload := func(from, to int) {
			var recs []*gpupassv1.Record
			for step := from; step <= to; step++ {
				time.Sleep(2 * time.Millisecond) // distinct timestamps
				ts := time.Now().UTC().Format(time.RFC3339Nano)
				recs = append(recs, &gpupassv1.Record{Seq: uint64(step), Kind: gpupassv1.RecordKind_RECORD_KIND_METRIC,
					Data: fmt.Appendf(nil, `{"step":%d,"ts":%q,"attempt":1,"values":{"loss":%g}}`, step, ts, scale*2/float64(step))})
			}
			if _, err := c.Work.UploadRecords(ctx, connect.NewRequest(&gpupassv1.UploadRecordsRequest{AgentId: agentID, AllocId: as.AllocId,
				FencingToken: as.FencingToken, Records: recs})); err != nil && ctx.Err() == nil {
				t.Errorf("uploading records of %s: %v", as.AllocId, err)
			}
		}
		update(gpupassv1.AllocState_ALLOC_STATE_STARTING, 0)
		update(gpupassv1.AllocState_ALLOC_STATE_RUNNING, 0)
		upload(1, 10)
		select {
		case <-release:
		case <-ctx.Done():
			return
		}
		upload(11, 20)
		update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 20)
	})
}

// Issue #35, "a comment while it runs": `gpupass -o github compare
// --partial GROUP` on a pull request, while the group's runs still run,
// posts an in-progress report (each run's state, last step, the last
// loss the broker holds, links to the dashboard) and exits 0; without
// --partial the unfinished runs are refused as before. Once the runs
// have ended the same command posts the verdict into the same comment,
// edited in place, and renders exactly what compare without --partial
// renders. The same on GitHub (PR comment) and GitLab (MR note).
func TestComparePartialEditsTheStickyComment(t *testing.T) {
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	release := make(chan struct{})
	slowAgent(t, b.URL, agentTok, brokertest.H100("us-west-2", 20), 1, release)
	slowAgent(t, b.URL, agentTok, brokertest.H100("eu-central-1", 21), 1.01, release)
	tok := b.Token(t, store.RoleSubmit, "*")
	broker := []string{"--broker-url", b.URL, "--broker-token", tok}
	code, out, errOut := runMain(t, append(append([]string{"train", "--spec", writeH100Spec(t), "--region", "us-west-2", "--region", "eu-central-1"}, broker...), "--", "python3", "train.py")...)
	ids, group := allocRE.FindAllString(out, -1), groupRE.FindString(out)
	if code != 0 || len(ids) != 2 || group == "" {
		t.Fatalf("train: exit %d, allocs %v, group %q\n%s\n%s", code, ids, group, out, errOut)
	}
	rc, err := client.DialRuns(b.URL, client.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	points := func(id string) []*gpupassv1.MetricPoint {
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
		if err != nil {
			return nil
		}
		return mr.Msg.Points
	}
	state := func(id string) gpupassv1.AllocState {
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Run.State
	}
	for _, id := range ids {
		waitFor(t, id+" to hold its first 10 points", func() bool { return len(points(id)) == 10 })
	}

	dir := t.TempDir()
	gh, gl := &gpupass.GitHubPR{}, &gpupass.GitLabMR{}
	ghSrv, glSrv := httptest.NewServer(gh), httptest.NewServer(gl)
	defer ghSrv.Close()
	defer glSrv.Close()
	event := filepath.Join(dir, "event.json")
	os.WriteFile(event, []byte(`{"pull_request":{"number":7}}`), 0o644)
	// The compare-report step on each forge: its CI's variables, a pull
	// or merge request to post to, the step outputs where stepOutput
	// reads them.
	forges := []struct {
		kind   string // -o
		env    map[string]string
		marker string
		bodies func() []string
		edits  func() int
	}{
		{"github", map[string]string{
			"GITHUB_ACTIONS": "true", "GITLAB_CI": "", "GITHUB_EVENT_PATH": event, "GITHUB_REPOSITORY": "acme/train",
			"GITHUB_RUN_ID": "77", "GITHUB_API_URL": ghSrv.URL, "GITHUB_TOKEN": "ghs_x", "GITHUB_STEP_SUMMARY": "",
			"GITHUB_OUTPUT": filepath.Join(dir, "output"),
		}, `<!-- gpupass:report tag="compare" run=77 `, gh.Bodies, gh.Edits},
		{"gitlab", map[string]string{
			"GITHUB_ACTIONS": "", "GITLAB_CI": "true", "CI_API_V4_URL": glSrv.URL + "/api/v4", "CI_MERGE_REQUEST_PROJECT_ID": "4",
			"CI_MERGE_REQUEST_IID": "2", "CI_PIPELINE_ID": "31", "CI_COMMIT_SHA": "c0ffee", "GITLAB_TOKEN": "glpat-x",
			"GPUPASS_DOTENV": filepath.Join(dir, "gpupass.env"),
		}, `<!-- gpupass:report tag="compare" run=31 `, gl.Bodies, gl.Edits},
	}
	t.Setenv("GPUPASS_DASHBOARD_URL", "https://gpupass.example.com")
	run := func(env map[string]string, args ...string) (int, string, string) {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		var out, errb bytes.Buffer
		args = append(append([]string{"compare", "--report-dir", filepath.Join(dir, "report")}, args...), broker...)
		code := gpupass.Main(ctx, args, strings.NewReader(""), &out, &errb, gpupass.WithPoster(forgepost.Poster{}))
		return code, out.String(), errb.String()
	}
	removeOutputs := func() {
		os.Remove(filepath.Join(dir, "output"))
		os.Remove(filepath.Join(dir, "gpupass.env"))
	}

	for _, f := range forges {
		// Without --partial a run that has not ended is refused, as before.
		if code, _, errOut := run(f.env, "-o", f.kind, group); code != 2 || !strings.Contains(errOut, "is still running (10 points so far, last step 10)") {
			t.Errorf("%s: compare without --partial: exit %d, want 2 and the refusal\n%s", f.kind, code, errOut)
		}
		if b := f.bodies(); len(b) != 0 {
			t.Fatalf("%s: a refused compare posted %q", f.kind, b)
		}

		code, out, errOut := run(f.env, "-o", f.kind, "--partial", "--fail-on-divergence", group)
		if code != 0 {
			t.Fatalf("%s: compare --partial while running: exit %d, want 0 (not a verdict)\n%s\n%s", f.kind, code, out, errOut)
		}
		bodies := f.bodies()
		if len(bodies) != 1 {
			t.Fatalf("%s: comments %q, want one", f.kind, bodies)
		}
		body := bodies[0]
		want := []string{
			f.marker, "### ⏳ gpupass compare: in progress",
			"**Not a verdict yet:** 2 of 2 run(s) have not ended", "#### Runs so far", "```mermaid",
		}
		for _, id := range ids {
			pts := points(id)
			last := pts[len(pts)-1]
			// The row of the run: its state and the last loss the broker
			// holds for it, as the report writes numbers.
			row := fmt.Sprintf("⏳ running | broker:%s | %d ", id, last.Step)
			if !strings.Contains(body, row) || !strings.Contains(body, "| "+report.Num(last.Values["loss"])+" ") {
				t.Errorf("%s: the in-progress comment lacks %s's row %q with last loss %s", f.kind, id, row, report.Num(last.Values["loss"]))
			}
			want = append(want, "(https://gpupass.example.com/ui/runs/"+id+")")
		}
		for _, w := range want {
			if !strings.Contains(body, w) || !strings.Contains(out, strings.TrimPrefix(w, f.marker)) {
				t.Errorf("%s: the in-progress comment or log lacks %q:\n%s", f.kind, w, body)
			}
		}
		for _, no := range []string{"#### Pairs", "consistent", "diverged"} {
			if strings.Contains(body, no) {
				t.Errorf("%s: the in-progress comment reads %q, as if it were a verdict:\n%s", f.kind, no, body)
			}
		}
		if v := stepOutput(t, f.kind, dir, "verdict"); v != "in progress" {
			t.Errorf("%s: the verdict output is %q, want in progress", f.kind, v)
		}
	}

	removeOutputs()
	close(release)
	for _, id := range ids {
		waitFor(t, id+" to succeed", func() bool { return state(id) == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED })
	}
	for _, f := range forges {
		code, out, errOut := run(f.env, "-o", f.kind, "--partial", "--fail-on-divergence", group)
		if code != 0 {
			t.Fatalf("%s: compare --partial after the runs ended: exit %d\n%s\n%s", f.kind, code, out, errOut)
		}
		bodies := f.bodies()
		if len(bodies) != 1 || f.edits() != 1 {
			t.Fatalf("%s: %d comment(s), %d edit(s), want the in-progress one edited into the verdict:\n%s", f.kind, len(bodies), f.edits(), strings.Join(bodies, "\n----\n"))
		}
		if !strings.HasPrefix(bodies[0], f.marker) || !strings.Contains(bodies[0], "### ✅ gpupass compare: consistent") || strings.Contains(bodies[0], "in progress") ||
			!strings.Contains(bodies[0], "1..20 (20 pts)") {
			t.Errorf("%s: the comment after the runs ended is not the verdict on all 20 steps:\n%s", f.kind, bodies[0])
		}
		if v := stepOutput(t, f.kind, dir, "verdict"); v != "consistent" {
			t.Errorf("%s: the verdict output is %q, want consistent", f.kind, v)
		}
	}

	// Once every run has ended, --partial renders the verdict exactly.
	_, partial, _ := run(nil, "--post", "none", "--partial", group)
	_, plain, errOut := run(nil, "--post", "none", group)
	if partial != plain || !strings.Contains(plain, "consistent") {
		t.Errorf("--partial after the runs ended renders\n%s\nwithout it\n%s\n%s", partial, plain, errOut)
	}
}
