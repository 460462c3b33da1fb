//go:build e2e

package ui_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/browsertest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// metricsScript prints a loss curve as gpupass:metric lines, one step
// every `sleep` seconds (forever when steps is 0), with a log line each.
func metricsScript(steps int, sleep string) []string {
	cond := "[ $i -lt " + strconv.Itoa(steps) + " ]"
	if steps == 0 {
		cond = "true"
	}
	return []string{"sh", "-c", "i=0; while " + cond + "; do i=$((i+1)); " +
		`echo "gpupass:metric {\"step\": $i, \"loss\": $(awk "BEGIN{print 2/($i+1)}")}"; echo "trainer: step $i"; sleep ` + sleep + "; done"}
}

// TestDashboardBrowser drives the dashboard of a real `gpupass up` with
// headless Chromium, as issue #20's done-when line asks: a read token
// sees both regions' nodes with their scores; a us-only token sees no eu
// node or run; a running run's log lines and curve points arrive without
// a reload; two finished runs compare; a submit token cancels a run; a
// cross-site POST is refused. Screenshots of each page are kept.
func TestDashboardBrowser(t *testing.T) {
	chrome := testutil.Tool(t, "chromium")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{})
	cfg := stack.Config(t)
	if !strings.Contains(stack.Out.String(), "ui      "+cfg.BrokerURL+"/ui/") {
		t.Fatalf("gpupass up does not print the dashboard URL:\n%s", stack.Out.String())
	}
	// The pages docs/using.md shows, retaken by `make screenshots`.
	shots := testutil.Screenshots(t, "dashboard", map[string]string{
		"nodes": "dashboard-nodes.png", "run-live": "dashboard-run-live.png", "run-finished": "dashboard-run-finished.png",
		"compare": "dashboard-compare.png",
	})

	token := func(role, regions string) string {
		t.Helper()
		out, errOut, code := testutil.Run(t, exec.Command(filepath.Join(stack.Bin, "gpupass-broker"), "--db", "sqlite://"+filepath.Join(stack.State, "broker.db"),
			"-o", "json", "token", "create", "--role", role, "--regions", regions))
		var tj struct{ Token string }
		if code != 0 || json.Unmarshal([]byte(out), &tj) != nil || tj.Token == "" {
			t.Fatalf("token create %s %s: exit %d\n%s\n%s", role, regions, code, out, errOut)
		}
		return tj.Token
	}
	readAll, readUS, submit := token("read", "*"), token("read", "us-*"), cfg.Token

	train := func(name string, follow bool, command []string, regions ...string) {
		t.Helper()
		args := []string{"train", "--spec", "examples/train/gpupass.yaml", "--workdir", "examples/train", "--name", name}
		for _, r := range regions {
			args = append(args, "--region", r)
		}
		if follow {
			args = append(args, "--follow")
		}
		cmd := stack.Command(ctx, append(append(args, "--"), command...)...)
		cmd.Env = append(cmd.Env, "GPUPASS_BROKER_URL=", "GPUPASS_BROKER_TOKEN=")
		out, errOut, code := testutil.Run(t, cmd)
		if code != 0 {
			t.Fatalf("train %s: exit %d\n%s\n%s", name, code, upstack.Tail(out, 2000), errOut)
		}
	}
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: submit})
	if err != nil {
		t.Fatal(err)
	}
	byName := func(name string) *gpupassv1.Run {
		t.Helper()
		resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Msg.Runs {
			if r.Name == name {
				return r
			}
		}
		return nil
	}
	train("fin", true, metricsScript(12, "0"), "us-west-2", "eu-central-1")
	train("live", false, metricsScript(0, "0.4"), "us-west-2")
	finUS, finEU := byName("fin-us-west-2"), byName("fin-eu-central-1")
	var live *gpupassv1.Run
	upstack.WaitFor(t, ctx, "the live run to log 3 points", func() bool {
		live = byName("live-us-west-2")
		return live != nil && live.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING && live.HeldThrough > 6
	})

	// One browser, one tab: users take turns, logging out between.
	br := browsertest.Start(t, ctx, chrome, 1280, 800, shots)
	bctx := br.Ctx
	base := cfg.BrokerURL
	// Each step gets 30 s, so a missing element fails the test quickly.
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(bctx, 30*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string { t.Helper(); return br.Eval(t, expr) }
	shot := func(name string) { t.Helper(); br.Shot(t, name) }
	login := func(tok string) {
		t.Helper()
		do("log in", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), tok), chromedp.Submit(chromedp.CSS("#token")),
			chromedp.WaitVisible(chromedp.CSS("#nodes")))
	}
	logout := func() {
		t.Helper()
		do("log out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#token")))
		if got := eval(`location.pathname`); got != "/ui/login" {
			t.Fatalf("after logout the page is %s, want /ui/login", got)
		}
	}

	// A read token for every region: both regions' nodes, each scored.
	do("open the dashboard", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	shot("login")
	login(readAll)
	regions := eval(`[...new Set([...document.querySelectorAll("tr.node")].map(r => r.dataset.region))].sort().join(",")`)
	scores := eval(`[...document.querySelectorAll("tr.node .score")].map(e => e.textContent).join(",")`)
	if regions != "eu-central-1,us-west-2" || !regexp.MustCompile(`^\d+\.\d(,\d+\.\d)+$`).MatchString(scores) {
		t.Fatalf("read token's node page: regions %q scores %q, want both regions, each node scored", regions, scores)
	}
	if terms := eval(`document.querySelector("tr.node .terms").textContent`); !strings.Contains(terms, "latency") || !strings.Contains(terms, "failures") || !strings.Contains(terms, "price") {
		t.Fatalf("score terms %q: want latency, failures and price", terms)
	}
	shot("nodes")
	do("runs page", chromedp.Navigate(base+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#runs")))
	if got := eval(`[...new Set([...document.querySelectorAll("tr.run")].map(r => r.dataset.region))].sort().join(",")`); got != "eu-central-1,us-west-2" {
		t.Fatalf("read token's runs page shows regions %q, want both", got)
	}
	if got := eval(`String(document.querySelectorAll("#cancel").length)`); got != "0" {
		t.Fatal("a read token is offered a cancel button")
	}
	shot("runs")
	do("phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"/ui/nodes"), chromedp.WaitVisible(chromedp.CSS("#nodes")))
	if w := eval(`String(document.documentElement.scrollWidth)`); w != "390" {
		t.Errorf("nodes page at phone width is %s px wide, want 390 (no sideways scroll)", w)
	}
	shot("nodes-phone")
	do("desktop width", chromedp.EmulateViewport(1280, 800))
	scheme := func(v string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: v}}})
			return chromedp.Void{}, err
		}
	}
	do("dark mode", scheme("dark"), chromedp.Navigate(base+"/ui/nodes"), chromedp.WaitVisible(chromedp.CSS("#nodes")))
	if bg := eval(`getComputedStyle(document.body).backgroundColor`); bg == "rgb(255, 255, 255)" {
		t.Errorf("dark mode: body background %s, want dark", bg)
	}
	shot("nodes-dark")
	do("light mode", scheme("light"))
	logout()

	// A us-only token sees no eu node or run, and cannot open one.
	login(readUS)
	if got := eval(`[...document.querySelectorAll("tr.node")].map(r => r.dataset.region).filter(r => !r.startsWith("us-")).join(",")`); got != "" {
		t.Fatalf("us-only token sees nodes of %s", got)
	}
	if got := eval(`String(document.querySelectorAll("tr.node").length)`); got == "0" {
		t.Fatal("us-only token sees no node at all")
	}
	do("runs page", chromedp.Navigate(base+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#runs")))
	if got := eval(`[...document.querySelectorAll("tr.run")].map(r => r.dataset.region).join(",")`); strings.Contains(got, "eu-") || !strings.Contains(got, "us-west-2") {
		t.Fatalf("us-only token's runs page shows regions %q, want us-west-2 only", got)
	}
	do("eu run page", chromedp.Navigate(base+"/ui/runs/"+finEU.Id), chromedp.WaitVisible(chromedp.CSS("#error")))
	if got := eval(`document.getElementById("error").textContent`); !strings.Contains(got, "outside the scope") {
		t.Fatalf("us-only token opening %s: %q, want a scope refusal", finEU.Id, got)
	}
	logout()

	// The submit token: a running run's log and curve arrive live.
	login(submit)
	do("live run page", chromedp.Navigate(base+"/ui/runs/"+live.Id), chromedp.WaitVisible(chromedp.CSS("#log")))
	eval(`window.__sameLoad = "yes"; ""`)
	lines0, points0 := eval(`String(document.querySelectorAll("#log span").length)`), eval(`document.getElementById("points").textContent`)
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.querySelectorAll("#log span").length >= `+lines0+`+4 && +document.getElementById("points").textContent >= `+points0+`+2 && document.getElementById("chart").src.includes("n=")`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("no new log lines and points arrived on %s (had %s lines, %s points; now %s lines, %s points): %v", live.Id, lines0, points0,
			eval(`String(document.querySelectorAll("#log span").length)`), eval(`document.getElementById("points").textContent`), err)
	}
	if eval(`String(window.__sameLoad)`) != "yes" {
		t.Fatal("the run page reloaded to show new lines")
	}
	if !strings.Contains(eval(`document.getElementById("log").textContent`), "trainer: step") {
		t.Fatal("the live log does not show the job's lines")
	}
	shot("run-live")
	// The API gives a run's signed report once it has finished.
	do("finished run page", chromedp.Navigate(base+"/ui/runs/"+finUS.Id), chromedp.WaitVisible(chromedp.CSS("#log")))
	if eval(`document.getElementById("sig-ok") && document.querySelectorAll("#checks tr").length > 3 ? "y" : "n"`) != "y" {
		t.Errorf("the run page does not show a verified signed conformance report: %s", eval(`document.querySelector("main").innerText.split("Signed conformance report")[1] || ""`))
	}
	shot("run-finished")
	// Its spec fingerprint links to the nodes certified for that spec:
	// up's simulated nodes measure the example's runtime.
	do("nodes certified for the run's spec", chromedp.Click(chromedp.CSS("#certified-nodes")), chromedp.WaitVisible(chromedp.CSS("#nodes")))
	if n, text := eval(`String(document.querySelectorAll("tr.node").length)`), eval(`document.querySelector("main").innerText`); n == "0" || !strings.Contains(text, "certified for spec fingerprint") {
		t.Errorf("nodes certified for %s's spec: %s node(s), page:\n%s", finUS.Id, n, upstack.Tail(text, 1500))
	}
	shot("nodes-certified")

	// Compare two finished runs, picked on the runs page.
	do("compare", chromedp.Navigate(base+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#runs")),
		chromedp.Click(chromedp.CSS(`input[value="`+finUS.Id+`"]`)), chromedp.Click(chromedp.CSS(`input[value="`+finEU.Id+`"]`)),
		chromedp.Click(chromedp.CSS("#compare-form button")), chromedp.WaitVisible(chromedp.CSS("#verdict")))
	if v := eval(`document.getElementById("verdict").textContent`); !strings.Contains(v, "consistent") {
		t.Fatalf("compare verdict %q, want consistent (same curve in both regions)", v)
	}
	// The chart is report.SVG's (gonum/plot): its legend names both
	// runs by region, as the tables do.
	if legend := eval(`Array.from(document.querySelectorAll("#compare-chart svg text")).map(e => e.textContent).join("\n")`); !strings.Contains(legend, "\nus-west-2\n") || !strings.Contains(legend, "\neu-central-1\n") {
		t.Fatalf("compare chart's texts lack a run's name:\n%s", legend)
	}
	// Under the page's CSP (no inline styles) the chart keeps its colours:
	// the background white, not every path filled black.
	if bg := eval(`getComputedStyle(document.querySelector("#compare-chart svg path")).fill`); bg != "rgb(255, 255, 255)" {
		t.Errorf("compare chart's background is %s, want white (styles dropped by the CSP?)", bg)
	}
	shot("compare")

	// Cross-site POSTs are refused: no CSRF token, or a foreign Origin.
	crossSite(t, base, submit, live.Id)
	if r := byName("live-us-west-2"); r.CancelRequested || r.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING {
		t.Fatalf("after the refused cross-site POSTs the live run is %s (cancel requested %v), want running", r.State, r.CancelRequested)
	}

	// Cancel with the submit token.
	do("cancel", chromedp.Navigate(base+"/ui/runs/"+live.Id), chromedp.WaitVisible(chromedp.CSS("#cancel")),
		chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#log")))
	upstack.WaitFor(t, ctx, "the live run to end cancelled", func() bool {
		return byName("live-us-west-2").State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
	})
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("state").textContent === "cancelled"`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the run page does not show the run cancelled: %v", err)
	}
	shot("run-cancelled")
	logout()

	// No token in the broker's log.
	logs, _ := filepath.Glob(filepath.Join(stack.State, "logs", "*.log"))
	for _, f := range logs {
		b, _ := os.ReadFile(f)
		for _, tok := range []string{readAll, readUS, submit} {
			if strings.Contains(string(b), tok) {
				t.Errorf("%s contains a token secret", f)
			}
		}
	}
}

// crossSite logs in over plain HTTP and sends the cancel a cross-site
// page could: without the CSRF token, and with it from a foreign Origin.
// Both must be refused; then logout must end the session server side.
func crossSite(t *testing.T, base, tok, alloc string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(path string, form url.Values, origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	resp := post("/ui/login", url.Values{"token": {tok}}, "")
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login over HTTP: %s", resp.Status)
	}
	sc := resp.Header.Get("Set-Cookie")
	if !strings.Contains(sc, "HttpOnly") || !strings.Contains(sc, "SameSite=Strict") || strings.Contains(sc, tok) {
		t.Fatalf("session cookie %q: want HttpOnly, SameSite=Strict, no token", sc)
	}
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := c.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp, string(b)
	}
	page, body := get("/ui/runs/" + alloc)
	if csp := page.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("Content-Security-Policy %q: want script-src 'self' and nothing inline", csp)
	}
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on the run page:\n%s", upstack.Tail(body, 1500))
	}
	for _, tc := range []struct {
		name   string
		form   url.Values
		origin string
	}{
		{"no CSRF token", url.Values{}, ""},
		{"wrong CSRF token", url.Values{"csrf": {"forged"}}, ""},
		{"foreign origin", url.Values{"csrf": {m[1]}}, "http://evil.example"},
	} {
		if resp := post("/ui/runs/"+alloc+"/cancel", tc.form, tc.origin); resp.StatusCode != http.StatusForbidden {
			t.Errorf("cross-site cancel (%s): %s, want 403 Forbidden", tc.name, resp.Status)
		}
	}
	if resp := post("/ui/logout", url.Values{"csrf": {m[1]}}, ""); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %s", resp.Status)
	}
	// The old cookie, sent again by hand, no longer opens a page.
	u, _ := url.Parse(base + "/ui/")
	jar.SetCookies(u, []*http.Cookie{{Name: "gpupass_session", Value: cookieValue(sc), Path: "/ui/"}})
	if resp, _ := get("/ui/nodes"); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login" {
		t.Fatalf("after logout the old session cookie gets %s (Location %q), want a redirect to the login page", resp.Status, resp.Header.Get("Location"))
	}
}

func cookieValue(setCookie string) string {
	v, _, _ := strings.Cut(setCookie, ";")
	_, v, _ = strings.Cut(v, "=")
	return v
}
