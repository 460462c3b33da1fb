// Package browsertest is the one headless Chromium of the browser tests
// (the dashboard's, the compare report's): started the same way, with
// the same evaluation and screenshot steps, saved through
// testutil.Screenshots. A package of its own so that only those tests
// link chromedp.
package browsertest

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gpupass/gpupass/internal/testutil"
)

// Browser is one tab of a headless Chromium, closed when the test ends.
type Browser struct {
	// Ctx is the tab's context, for chromedp.Do and chromedp.Run.
	Ctx   context.Context
	shots *testutil.Shots
}

// Start starts chrome (testutil.Tool(t, "chromium")) headless, without
// a sandbox (tests run as root) or GPU, in a width x height window, and
// opens its tab; it ends with ctx or the test. shots is where Shot saves.
func Start(t testing.TB, ctx context.Context, chrome string, width, height int, shots *testutil.Shots) *Browser {
	t.Helper()
	actx, acancel := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(chrome), chromedp.Headless, chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(width, height))
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", chrome, err)
	}
	return &Browser{Ctx: bctx, shots: shots}
}

// Eval is the string expr evaluates to in the tab; an error fails the
// test.
func (b *Browser) Eval(t testing.TB, expr string) string {
	t.Helper()
	v, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("evaluating %.80s: %v", expr, err)
	}
	return v
}

// Shot saves a screenshot of the whole page as name (Shots.Save); one
// not taken within a minute is an error of the test, which goes on.
func (b *Browser) Shot(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, time.Minute)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	b.shots.Save(t, name, png)
}
