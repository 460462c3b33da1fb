//go:build e2e

package gpupass_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/report"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Issue #35, "a comment while it runs", on the built binaries against
// `gpupass up`: a detached train of two regions whose script trains
// slowly; `gpupass -o github compare --partial GROUP` on a pull request
// while the runs run prints and posts "in progress" with each run's
// state and the last loss the broker holds for its last step, and exits
// 0; after `gpupass wait GROUP` the same command prints the verdict and
// edits the same comment into it.
func TestE2EComparePartialGroup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	// The broker knows where users reach its dashboard (up passes
	// --public-url to serve): the report links each run's page there
	// with no dashboard-url input.
	stack := upstack.Start(t, upstack.Options{Env: []string{"PATH=" + upstack.BuildAll(t) + ":" + os.Getenv("PATH")},
		Args: []string{"--public-url", "https://gpupass.example.com"}})
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}

	// 20 s of steps, the same losses in both regions.
	job := `i=1; while [ $i -le 20 ]; do echo "step $i loss 0.$((100-i))"; i=$((i+1)); sleep 1; done`
	stdout, stderr, code := gp(t, ctx, stack, "train", "--detach", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2,eu-central-1", "--name", "partial", "--", "sh", "-c", job)
	ids, group := allocRE.FindAllString(stdout, -1), groupRE.FindString(stdout)
	if code != 0 || len(ids) != 2 || group == "" {
		t.Fatalf("train --detach: exit %d, allocs %v, group %q\nstdout:\n%s\nstderr:\n%s", code, ids, group, stdout, stderr)
	}
	loss := func(id string) (map[int64]float64, gpupassv1.AllocState) {
		mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
		if err != nil {
			t.Fatalf("metrics of %s: %v", id, err)
		}
		m := map[int64]float64{}
		for _, p := range mr.Msg.Points {
			if v, ok := p.Values["loss"]; ok {
				m[p.Step] = v
			}
		}
		return m, mr.Msg.Run.State
	}
	for _, id := range ids {
		upstack.WaitFor(t, ctx, id+" to log 3 steps", func() bool { m, _ := loss(id); return len(m) >= 3 })
	}

	dir := t.TempDir()
	gh := &gpupass.GitHubPR{}
	srv := httptest.NewServer(gh)
	defer srv.Close()
	event := filepath.Join(dir, "event.json")
	if err := os.WriteFile(event, []byte(`{"pull_request":{"number":7}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// The compare-report step as the action runs it: its inputs as
	// GPUPASS_* variables, on a pull request.
	compare := func() (string, string, int) {
		t.Helper()
		cmd := stack.Command(ctx, "-o", "github", "compare", "--partial", "--", group)
		cmd.Env = append(cmd.Env, "GITHUB_ACTIONS=true", "GITLAB_CI=", "GITHUB_EVENT_PATH="+event, "GITHUB_REPOSITORY=acme/train",
			"GITHUB_RUN_ID=77", "GITHUB_API_URL="+srv.URL, "GITHUB_TOKEN=ghs_x", "GITHUB_STEP_SUMMARY=", "GITHUB_OUTPUT="+filepath.Join(dir, "output"),
			"GPUPASS_REPORT_DIR="+filepath.Join(dir, "report"), "GPUPASS_FAIL_ON_DIVERGENCE=true", "GPUPASS_DASHBOARD_URL=")
		return testutil.Run(t, cmd)
	}

	stdout, stderr, code = compare()
	if code != 0 {
		t.Fatalf("compare --partial while the runs run: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, w := range []string{"### ⏳ gpupass compare: in progress", "**Not a verdict yet:**", "#### Runs so far"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("compare --partial printed no %q:\n%s", w, stdout)
		}
	}
	for _, id := range ids {
		// The run's row: its state, last step and loss so far; the loss
		// is the broker's for that step, read from the metrics API.
		m := regexp.MustCompile(`\| ⏳ (\w+) +\| broker:` + id + ` +\| (\d+) +\| (\S+) `).FindStringSubmatch(stdout)
		if m == nil {
			t.Errorf("no in-progress row for %s:\n%s", id, stdout)
			continue
		}
		step, _ := strconv.ParseInt(m[2], 10, 64)
		got, _ := loss(id)
		if v, ok := got[step]; m[1] != "running" || !ok || report.Num(v) != m[3] || step < 3 || step >= 20 {
			t.Errorf("%s: state %s, last step %d, last loss %s; want running, a step in 3..19 and the broker's loss there (%v, logged: %v)", id, m[1], step, m[3], v, ok)
		}
		if !strings.Contains(stdout, "https://gpupass.example.com/ui/runs/"+id) {
			t.Errorf("no dashboard link for %s:\n%s", id, stdout)
		}
	}
	if b := gh.Bodies(); len(b) != 1 || !strings.Contains(b[0], "gpupass compare: in progress") {
		t.Fatalf("the pull request's comments while the runs run: %q, want one, in progress", b)
	}
	if v := stepOutput(t, "github", dir, "verdict"); v != "in progress" {
		t.Errorf("verdict output %q, want in progress", v)
	}

	if stdout, stderr, code := gp(t, ctx, stack, "wait", "--", group); code != 0 {
		t.Fatalf("wait %s: exit %d\n%s\n%s", group, code, stdout, stderr)
	}
	for _, id := range ids {
		if _, st := loss(id); st != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			t.Fatalf("%s is %s after wait, want succeeded", id, st)
		}
	}
	os.Remove(filepath.Join(dir, "output"))
	stdout, stderr, code = compare()
	if code != 0 || !strings.Contains(stdout, "### ✅ gpupass compare: consistent") || strings.Contains(stdout, "in progress") {
		t.Fatalf("compare --partial after wait: exit %d, want 0 and the verdict\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if b := gh.Bodies(); len(b) != 1 || gh.Edits() != 1 || !strings.Contains(b[0], "### ✅ gpupass compare: consistent") || !strings.Contains(b[0], "1..20 (20 pts)") {
		t.Errorf("the pull request's comments after wait (%d edit(s)): %q, want the one comment edited into the verdict on 20 steps", gh.Edits(), b)
	}
	if v := stepOutput(t, "github", dir, "verdict"); v != "consistent" {
		t.Errorf("verdict output %q, want consistent", v)
	}
}
