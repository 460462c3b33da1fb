//go:build e2e

package ui_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/browsertest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestDashboardQueue (issue #35): a run waiting for the one busy node of
// its region shows its queue position on the runs list and where it
// stands on its run page, in headless Chromium against a real `gpupass
// up`. Screenshots: queue-runs, queue-run.
func TestDashboardQueue(t *testing.T) {
	chrome := testutil.Tool(t, "chromium")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	shots := testutil.Screenshots(t, "dashboard-queue", nil)
	submit := func(name string) runview.Run {
		t.Helper()
		out, err := stack.Command(ctx, "-o", "json", "train", "--spec", "examples/train/gpupass.yaml", "--workdir", "examples/train", "--region", "us-west-2",
			"--name", name, "--detach", "--", "sh", "-c", "echo started; exec sleep 600").Output()
		var l runview.List
		if err != nil || json.Unmarshal(out, &l) != nil || len(l.Runs) != 1 {
			t.Fatalf("train %s --detach: %v\n%s", name, err, out)
		}
		return l.Runs[0]
	}
	first := submit("holds-the-node")
	t.Cleanup(func() { _ = stack.Command(context.Background(), "cancel", first.ID).Run() })
	waiting := submit("waits")
	if waiting.QueuePosition != 1 {
		t.Fatalf("second run at queue position %d (%s), want 1", waiting.QueuePosition, waiting.State)
	}

	br := browsertest.Start(t, ctx, chrome, 1280, 800, shots)
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(br.Ctx, 30*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	base := cfg.BrokerURL
	do("log in", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), cfg.Token), chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS("#nodes")))
	do("runs page", chromedp.Navigate(base+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#runs")))
	got := br.Eval(t, `[...document.querySelectorAll("tr.run")].map(r => r.querySelector("a").textContent + "=" + (r.querySelector(".queue")?.dataset.position ?? "-")).join(",")`)
	for _, want := range []string{waiting.ID + "=1", first.ID + "=-"} {
		if !strings.Contains(got, want) {
			t.Errorf("runs page shows queue positions %q; want %s", got, want)
		}
	}
	br.Shot(t, "queue-runs")
	do("run page", chromedp.Navigate(base+"/ui/runs/"+waiting.ID), chromedp.WaitVisible(chromedp.CSS("#state")))
	if q := br.Eval(t, `document.querySelector("#queue")?.textContent ?? ""`); !strings.Contains(q, "waiting in the queue of us-west-2 at position 1 for 1 busy certified node") {
		t.Errorf("run page of %s says %q about its queue", waiting.ID, q)
	}
	br.Shot(t, "queue-run")
	do("the running run's page", chromedp.Navigate(base+"/ui/runs/"+first.ID), chromedp.WaitVisible(chromedp.CSS("#state")))
	if q := br.Eval(t, `document.querySelector("#queue")?.textContent ?? ""`); q != "" {
		t.Errorf("run page of the running %s shows a queue: %q", first.ID, q)
	}
}
