package ui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestDashboardFingerprintNames: each hash under its one name. The
// nodes filter over runtime fingerprints says so (it said "Spec
// fingerprint"), and a run page calls its spec's hash the spec
// fingerprint and the signed report's the runtime fingerprint.
func TestDashboardFingerprintNames(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	l := brokertest.StartRun(t, b, "us-west-2")
	l.Update(gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED, 0) // its evidence is served once it is over
	br := newBrowser(t, b.URL)
	br.login(b.Token(t, store.RoleRead, "*"))

	_, page := br.do("GET", "/ui/nodes", nil)
	if strings.Contains(page, "Spec fingerprint <select") || !strings.Contains(page, `Runtime fingerprint <select name="runtime_fingerprint"`) {
		t.Errorf("nodes page: the filter over runtime fingerprints is not labelled as such:\n%s", tail(page, 3000))
	}
	fp := l.Agent.Report().RuntimeFingerprint
	if resp, page := br.do("GET", "/ui/nodes?runtime_fingerprint="+url.QueryEscape(fp), nil); resp.StatusCode != http.StatusOK ||
		!strings.Contains(page, l.Agent.ID) || !strings.Contains(page, "with runtime fingerprint "+fp) {
		t.Errorf("nodes filtered by runtime fingerprint %s: %s, node shown %v\n%s", fp, resp.Status, strings.Contains(page, l.Agent.ID), tail(page, 2000))
	}

	_, page = br.do("GET", "/ui/runs/"+l.Run.Id, nil)
	for _, want := range []string{
		`<span class="muted">Spec fingerprint</span> <code id="spec-fp" title="` + l.Run.SpecFingerprint + `"`,
		`Runtime fingerprint <code id="runtime-fp">` + l.Run.SpecFingerprint + `</code>: equals the spec fingerprint`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("run page lacks %q:\n%s", want, tail(page, 4000))
		}
	}
}
