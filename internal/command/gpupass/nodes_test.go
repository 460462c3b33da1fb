package gpupass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/command/gpupass"
)

// cliBroker is a real broker (SQLite) with agents in three regions: two
// matching H100 nodes and one with another CUDA toolkit.
func cliBroker(t *testing.T) (url, read string, ids map[string]string) {
	t.Helper()
	// The nodes beat once, when they register: on a loaded machine (CI
	// runs test packages side by side) the tests that read them may come
	// more than Fast's minute later, and would find them offline.
	cfg := brokertest.Fast()
	cfg.OfflineAfter = time.Hour
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	tok := b.Token(t, store.RoleAgent, "*")
	east := brokertest.H100("us-east-1", 21)
	east.CUDA = "12.2.140"
	ids = map[string]string{}
	for name, n := range map[string]brokertest.NodeSpec{
		"west": brokertest.H100("us-west-2", 20), "eu": brokertest.H100("eu-central-1", 22), "east": east,
	} {
		ids[name] = brokertest.Register(t, b.URL, tok, n).ID
	}
	return b.URL, b.Token(t, store.RoleRead, "*"), ids
}

func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := gpupass.Main(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func writeH100Spec(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../../broker/testdata/h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "gpupass.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNodesSpecFingerprint: nodes --spec-fingerprint lists the nodes
// certified for a spec the broker knows (from a dry run here), as the
// dashboard's filter does; a spec it does not know is an error that
// says how to make it known.
func TestNodesSpecFingerprint(t *testing.T) {
	t.Parallel()
	url, read, ids := cliBroker(t)
	specPath := writeH100Spec(t)
	code, out, errs := runMain(t, "validate", "-f", specPath, "-o", "json", "--dry-run", "--broker-url", url, "--broker-token", read)
	if code != 0 {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, errs)
	}
	var dry struct{ Fingerprint string }
	if err := json.Unmarshal([]byte(out), &dry); err != nil || !strings.HasPrefix(dry.Fingerprint, "sha256:") {
		t.Fatalf("dry run's fingerprint %q: %v\n%s", dry.Fingerprint, err, out)
	}
	code, out, errs = runMain(t, "nodes", "--broker-url", url, "--broker-token", read, "--spec-fingerprint", dry.Fingerprint)
	if code != 0 {
		t.Fatalf("nodes --spec-fingerprint: exit %d\n%s%s", code, out, errs)
	}
	for _, id := range []string{ids["west"], ids["eu"]} {
		if !strings.Contains(out, id) {
			t.Errorf("a node certified for the spec, %s, is not listed:\n%s", id, out)
		}
	}
	if strings.Contains(out, ids["east"]) {
		t.Errorf("%s (CUDA 12.2, the spec wants 12.1) is listed:\n%s", ids["east"], out)
	}
	unknown := "sha256:" + strings.Repeat("0", 64)
	code, out, errs = runMain(t, "nodes", "--broker-url", url, "--broker-token", read, "--spec-fingerprint", unknown)
	// No spec here has that fingerprint: the hint is words, with no
	// placeholder a pasted command would take for a file.
	if code == 0 || !strings.Contains(errs, "names no spec this broker holds") || !strings.Contains(errs, "a dry run of the spec file with that fingerprint (gpupass validate's --dry-run) or a run of it makes it known") || strings.Contains(errs, "FILE") {
		t.Errorf("an unknown spec: exit %d\n%s%s", code, out, errs)
	}
}

// TestNodesUnknownSpecHintRunsAsPrinted: in a project whose spec the
// broker does not know yet, nodes --spec-fingerprint with its fingerprint
// names the dry run of that very file, and the command, pasted, makes
// the spec known (the broker from the environment, as a user's project
// has it from gpupass up's config).
func TestNodesUnknownSpecHintRunsAsPrinted(t *testing.T) {
	url, read, ids := cliBroker(t)
	spec, err := os.ReadFile(writeH100Spec(t))
	if err != nil {
		t.Fatal(err)
	}
	// The project's spec is above the working directory (a
	// subdirectory of the project).
	project := filepath.Join(t.TempDir(), "my project")
	if err := os.MkdirAll(filepath.Join(project, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(project, "gpupass.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(project, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(project, "src"))
	t.Setenv("GPUPASS_BROKER_URL", url)
	t.Setenv("GPUPASS_BROKER_TOKEN", read)
	code, out, errs := runMain(t, "validate", "--spec", "../gpupass.yaml", "-o", "json")
	var v struct{ Fingerprint string }
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil {
		t.Fatalf("validate: exit %d %v\n%s%s", code, err, out, errs)
	}
	code, _, errs = runMain(t, "nodes", "--spec-fingerprint", v.Fingerprint)
	const hint = "gpupass validate --dry-run --spec ../gpupass.yaml makes it known"
	if code == 0 || !strings.Contains(errs, hint) {
		t.Fatalf("nodes for a spec the broker does not know: exit %d, want the hint %q:\n%s", code, hint, errs)
	}
	pasted := strings.Fields(strings.TrimSuffix(hint, " makes it known"))[1:]
	if code, out, errs := runMain(t, pasted...); code != 0 {
		t.Fatalf("%q as printed: exit %d\n%s%s", pasted, code, out, errs)
	}
	code, out, errs = runMain(t, "nodes", "--spec-fingerprint", v.Fingerprint)
	if code != 0 || !strings.Contains(out, ids["west"]) {
		t.Errorf("nodes after the printed dry run: exit %d\n%s%s", code, out, errs)
	}
}

func TestNodesAndDryRun(t *testing.T) {
	t.Parallel()
	url, read, ids := cliBroker(t)
	specPath := writeH100Spec(t)
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
		absent   []string
		json     bool
	}{
		{name: "nodes text", args: []string{"nodes", "--broker-url", url, "--broker-token", read},
			contains: []string{ids["west"], ids["eu"], ids["east"], "h100-sxm5 x8", "simulated", "SCORE", "  HOST  ",
				ids["west"] + "  host-us-west-2  "}},
		{name: "nodes region", args: []string{"nodes", "--broker-url", url, "--broker-token", read, "--region", "eu-*"},
			contains: []string{ids["eu"]}, absent: []string{ids["west"], ids["east"]}},
		{name: "nodes json", args: []string{"nodes", "-o", "json", "--broker-url", url, "--broker-token", read}, json: true,
			contains: []string{`"nodes"`, `"health"`, `"latency_penalty"`, `"simulated": true`, `"admission": "admitted"`}},
		{name: "dry-run text", args: []string{"validate", "-f", specPath, "--dry-run", "--broker", url, "--broker-token", read},
			contains: []string{"2 candidate(s), 1 excluded", ids["west"], "excluded:", ids["east"] + " (us-east-1", "runtime.cuda: expected 12.1.105, measured 12.2.140"},
			// Dry-run's short form carries no hostname: no column of dashes.
			absent: []string{"HOST"}},
		{name: "dry-run json", args: []string{"validate", "-f", specPath, "-o", "json", "--dry-run", "--broker-url", url, "--broker-token", read}, json: true,
			contains: []string{`"fingerprint"`, `"dry_run"`, `"candidates"`, `"runtime_mismatch"`, `"measured": "12.2.140"`, `"excluded_total": 1`}},
		{name: "dry-run summary", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--excluded", "summary"},
			contains: []string{"2 candidate(s), 1 excluded", ids["west"], "excluded, by reason:", "1  runtime_mismatch (runtime.cuda), e.g. " + ids["east"]},
			absent:   []string{ids["east"] + " (us-east-1", "not listed"}},
		// The limit cuts the lists; the CLI says how many it left out,
		// counts every node, and names the flags that list them.
		{name: "dry-run limit", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--limit", "1"},
			contains: []string{"2 candidate(s), 1 excluded", "1 more candidate(s) not listed (the best 1 are): --limit N lists more, --all every one", ids["east"] + " (us-east-1"},
			absent:   []string{"excluded, by reason:"}},
		{name: "dry-run limit excluded", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--limit", "1", "--max-price", "5"},
			code: 1, contains: []string{"0 candidate(s), 3 excluded", "2 more excluded node(s) not listed (the nearest misses are): --limit N lists more, --all every one",
				"excluded, by reason:", "3  price_above_max (price_per_hour), e.g. "}},
		{name: "dry-run all", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--limit", "1", "--all"},
			contains: []string{"2 candidate(s), 1 excluded", ids["west"], ids["eu"], ids["east"] + " (us-east-1"}, absent: []string{"not listed", "by reason"}},
		{name: "dry-run bad --limit", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--limit", "0"},
			code: 2},
		{name: "dry-run bad --excluded", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--excluded", "some"},
			code: 2},
		{name: "dry-run nothing matches", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--max-price", "5"},
			code: 1, contains: []string{"0 candidate(s), 3 excluded", "above the maximum price 5/h"}},
		{name: "dry-run region", args: []string{"validate", "-f", specPath, "--dry-run", "--broker-url", url, "--broker-token", read, "--region", "us-west-2", "--min-health-score", "50"},
			contains: []string{"1 candidate(s), 2 excluded", "is not among the requested regions us-west-2", "min health score 50"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, out, errs := runMain(t, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, out, errs)
			}
			for _, s := range tt.contains {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.absent {
				if strings.Contains(out, s) {
					t.Errorf("output has %q:\n%s", s, out)
				}
			}
			if tt.json {
				var v map[string]any
				if err := json.Unmarshal([]byte(out), &v); err != nil {
					t.Errorf("--output json is not one JSON document: %v\n%s", err, out)
				}
			}
		})
	}
}

func TestBrokerErrors(t *testing.T) {
	t.Parallel()
	url, _, _ := cliBroker(t)
	tests := []struct {
		name     string
		args     []string
		contains string
	}{
		{"no url", []string{"nodes", "--broker-token", "x"}, "--broker-url"},
		{"no token", []string{"nodes", "--broker-url", url}, "GPUPASS_BROKER_TOKEN"},
		{"bad token", []string{"nodes", "--broker-url", url, "--broker-token", "gpp_secretvalue"}, "invalid token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, out, errs := runMain(t, tt.args...)
			if code != gpupass.ExitUsage || !strings.Contains(errs, tt.contains) {
				t.Errorf("exit %d, stderr %q; want 2 mentioning %q", code, errs, tt.contains)
			}
			if strings.Contains(out+errs, "gpp_secretvalue") {
				t.Error("the token appears in the output")
			}
		})
	}
}
