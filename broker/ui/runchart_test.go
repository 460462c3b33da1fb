package ui_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestDashboardRunWithoutMetrics: a run that never started says so
// instead of drawing an empty chart frame, and a started run whose loss
// values are all NaN or infinite says that.
func TestDashboardRunWithoutMetrics(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	specYAML, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := client.DialRuns(b.URL, client.Options{Token: b.Token(t, store.RoleSubmit, "*")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := sub.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: specYAML, Region: "ap-south-1", Command: []string{"true"}}))
	if err != nil {
		t.Fatal(err)
	}
	never := s.Msg.Run.Id
	if _, err := sub.Run.Cancel(ctx, connect.NewRequest(&gpupassv1.CancelRequest{AllocId: never, Reason: "test"})); err != nil {
		t.Fatal(err)
	}
	l := brokertest.StartRun(t, b, "us-west-2")
	if _, err := l.Upload(brokertest.MetricRecord(1, 1, `"loss":"NaN"`), brokertest.MetricRecord(2, 2, `"loss":"Infinity"`)); err != nil {
		t.Fatal(err)
	}

	br := newBrowser(t, b.URL)
	br.login(b.Token(t, store.RoleRead, "*"))
	for _, tc := range []struct {
		name, id, want string
	}{
		{"never started", never, `<p id="chart-note" class="muted">no metrics (the run never started)</p>`},
		{"no finite loss", l.Run.Id, `<p id="chart-note" class="muted">no finite loss values to draw: 2 loss point(s), each NaN or infinite</p>`},
	} {
		resp, page := br.do("GET", "/ui/runs/"+tc.id, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(page, tc.want) {
			t.Errorf("run page, %s: %s, want %q\n%s", tc.name, resp.Status, tc.want, tail(page, 3000))
		}
		if !strings.Contains(page, `class="chart" hidden`) {
			t.Errorf("run page, %s: the chart frame is shown", tc.name)
		}
		resp, svg := br.do("GET", "/ui/runs/"+tc.id+"/chart.svg", nil)
		if resp.StatusCode != http.StatusOK || strings.Contains(svg, "<rect") || !strings.Contains(svg, strings.TrimSuffix(strings.TrimPrefix(tc.want, `<p id="chart-note" class="muted">`), "</p>")) {
			t.Errorf("chart of the run, %s: %s\n%s", tc.name, resp.Status, svg)
		}
	}
}
