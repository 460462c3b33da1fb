package ui_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil"
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

// TestDashboardNodesCertifiedForSpec filters the nodes page by the spec
// fingerprint a node is certified for: its last report passed and its
// measured runtime is the spec's. Node A measures spec A's runtime, node
// B spec B's; the broker knows spec A from a run and spec B from a dry
// run on the dashboard.
func TestDashboardNodesCertifiedForSpec(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	a := brokertest.Register(t, b.URL, agentTok, brokertest.H100("us-west-2", 10))
	nb := brokertest.H100("us-west-2", 11)
	nb.Python = "3.11.4"
	bnode := brokertest.Register(t, b.URL, agentTok, nb)

	specA, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	specB := []byte(strings.Replace(string(specA), "python: 3.10.12", "python: 3.11.4", 1))
	fpA, fpB := fingerprint(t, specA), fingerprint(t, specB)

	// Spec A is known from a run of it (in a region without nodes: it
	// stays pending).
	sub, err := client.DialRuns(b.URL, client.Options{Token: b.Token(t, store.RoleSubmit, "*")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Run.Submit(context.Background(), connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: specA, Region: "ap-south-1", Command: []string{"true"}})); err != nil {
		t.Fatal(err)
	}

	br := newBrowser(t, b.URL)
	csrf := br.login(b.Token(t, store.RoleRead, "*"))
	// Spec B is not known yet: the page says how to make it known.
	resp, page := br.do("GET", "/ui/nodes?spec_fingerprint="+url.QueryEscape(fpB), nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "dry-run the spec or submit a run of it") {
		t.Errorf("nodes certified for an unknown spec: %s\n%s", resp.Status, tail(page, 1500))
	}
	resp, page = br.do("POST", "/ui/dryrun", url.Values{"spec": {string(specB)}, "csrf": {csrf}})
	// html/template escapes the colon in a query value.
	if link := `href="/ui/nodes?spec_fingerprint=` + strings.Replace(fpB, ":", "%3a", 1) + `"`; resp.StatusCode != http.StatusOK || !strings.Contains(page, link) {
		t.Fatalf("dry run of spec B: %s, want a link %s\n%s", resp.Status, link, tail(page, 3000))
	}

	for _, tc := range []struct {
		name, fp  string
		in, notIn *brokertest.Agent
	}{
		{"spec A", fpA, a, bnode},
		{"spec B", fpB, bnode, a},
	} {
		resp, page := br.do("GET", "/ui/nodes?spec_fingerprint="+url.QueryEscape(tc.fp), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("nodes certified for %s: %s\n%s", tc.name, resp.Status, tail(page, 1500))
		}
		if !strings.Contains(page, tc.in.ID) || strings.Contains(page, tc.notIn.ID) {
			t.Errorf("nodes certified for %s: node %s shown %v (want true), node %s shown %v (want false)",
				tc.name, tc.in.ID, strings.Contains(page, tc.in.ID), tc.notIn.ID, strings.Contains(page, tc.notIn.ID))
		}
		if want := "1 node(s) certified for spec fingerprint"; !strings.Contains(page, want) {
			t.Errorf("nodes certified for %s: the page lacks %q\n%s", tc.name, want, tail(page, 3000))
		}
		if !strings.Contains(page, `name="spec_fingerprint" id="spec-fingerprint" value="`+tc.fp+`"`) {
			t.Errorf("nodes certified for %s: the filter form does not keep the fingerprint", tc.name)
		}
	}
}

func fingerprint(t *testing.T, yaml []byte) string {
	t.Helper()
	res := spec.Validate("gpupass.yaml", yaml)
	if !res.Valid {
		t.Fatalf("spec does not validate: %+v", res.Findings)
	}
	return res.Fingerprint
}
