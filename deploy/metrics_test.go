package deploy

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/agent/agentmetrics"
	"github.com/gpupass/gpupass/broker/brokermetrics"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/promtest"
)

// TestPrometheusConfig: the example scrape config passes promtool (with
// its token file path pointed at a real file) and sends the broker a
// token from a file, never inline.
func TestPrometheusConfig(t *testing.T) {
	t.Parallel()
	promtool := testutil.Tool(t, "promtool")
	b, err := os.ReadFile(filepath.Join("prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	const tokenPath = "/etc/prometheus/gpupass-metrics-token"
	if !strings.Contains(string(b), "credentials_file: "+tokenPath) || strings.Contains(string(b), "bearer_token:") {
		t.Errorf("prometheus.yml: the broker job must read its token from credentials_file %s", tokenPath)
	}
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("secret-from-a-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(string(b), tokenPath, tok)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", cfg).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}

// TestGrafanaDashboard: the example dashboard is valid JSON, every
// gpupass metric its queries name is one the broker or the agent exports
// (histograms by their _bucket, _sum and _count series), and a real
// Prometheus parses every query.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("grafana", "gpupass.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/gpupass.json: %v", err)
	}
	known := append(brokermetrics.New(brokermetrics.Sources{}).Names(), agentmetrics.New(nil).Names()...)
	name := regexp.MustCompile(`\bgpupass_[a-z0-9_]+`)
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
			for _, n := range name.FindAllString(tg.Expr, -1) {
				base := n
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if s, ok := strings.CutSuffix(n, suf); ok && slices.Contains(known, s) {
						base = s
					}
				}
				if !slices.Contains(known, base) {
					t.Errorf("panel %q queries %s, which neither the broker nor the agent exports", p.Title, n)
				}
			}
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("%d queries in the dashboard; the parse found too few", len(exprs))
	}
	prom := promtest.StartPrometheus(t, "global:\n  scrape_interval: 1m\n")
	for _, e := range exprs {
		if _, _, err := prom.Query(context.Background(), e); err != nil && !strings.Contains(err.Error(), "samples, want one") {
			t.Errorf("Prometheus refuses a dashboard query: %v", err)
		}
	}
}

// TestMetricsDocumented: every family the broker and the agent export has
// a row in docs/metrics.md's tables (Broker (`gpupass_broker_…`) and Agent
// (`gpupass_agent_…`)), so an operator can look up what a series means.
func TestMetricsDocumented(t *testing.T) {
	t.Parallel()
	const page = "docs/metrics.md"
	b, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	// section is doc from start to end, or to the page's end when end is
	// empty (the agent's table closes the page).
	section := func(start, end string) string {
		i := strings.Index(doc, start)
		if i < 0 {
			t.Fatalf("%s: no %q", page, start)
		}
		if end == "" {
			return doc[i:]
		}
		j := strings.Index(doc[i+len(start):], end)
		if j < 0 {
			t.Fatalf("%s: nothing ends the section %q with %q", page, start, end)
		}
		return doc[i : i+len(start)+j]
	}
	for _, c := range []struct {
		prefix string
		table  string
		names  []string
	}{
		{"gpupass_broker_", section("Broker (`gpupass_broker_…`):", "Agent (`gpupass_agent_…`):"), brokermetrics.New(brokermetrics.Sources{}).Names()},
		{"gpupass_agent_", section("Agent (`gpupass_agent_…`):", ""), agentmetrics.New(nil).Names()},
	} {
		// A row's first cell names families in backticks, alone, as
		// `name{labels}`, or as `a`, `b`.
		documented := map[string]bool{}
		for _, line := range strings.Split(c.table, "\n") {
			if !strings.HasPrefix(line, "|") {
				continue
			}
			cell := strings.SplitN(line, "|", 3)[1]
			for _, m := range regexp.MustCompile("`([a-z0-9_]+)[`{]").FindAllStringSubmatch(cell, -1) {
				documented[m[1]] = true
			}
		}
		for _, n := range c.names {
			if short := strings.TrimPrefix(n, c.prefix); !documented[short] {
				t.Errorf("%s: %s has no row in the %s… metrics table", page, n, c.prefix)
			}
		}
	}
}
