//go:build e2e

package gpupass

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/nodeview"
	"github.com/gpupass/gpupass/internal/testutil"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestNodesAndDryRunJSON drives the built gpupass against a real broker
// and holds `nodes -o json` and `validate --dry-run -o json` to golden
// files and to the real jq (issue #32, item 6): numbers as numbers, RFC
// 3339 times, snake_case keys, no key a dry run's short form leaves out,
// and an out-of-scope node told by region only. The golden files are the
// documented contract (docs/using.md "Nodes and dry runs as JSON"); what varies
// between runs (node ids, times, measured round trips and the score
// terms that follow from them) is replaced by placeholders that keep
// the value's JSON type.
func TestNodesAndDryRunJSON(t *testing.T) {
	t.Parallel()
	jq := testutil.Tool(t, "jq")
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	agentTok := b.Token(t, store.RoleAgent, "*")
	east := brokertest.H100("us-east-1", 21)
	east.CUDA = "12.2.140"
	ids := map[string]string{}
	for _, n := range []struct {
		name string
		spec brokertest.NodeSpec
	}{{"west", brokertest.H100("us-west-2", 20)}, {"east", east}, {"eu", brokertest.H100("eu-central-1", 22)}} {
		ids[brokertest.Register(t, b.URL, agentTok, n.spec).ID] = "<node " + n.name + ">"
	}
	// A us-* token: the eu node is out of its scope.
	usTok := b.Token(t, store.RoleRead, "us-*")
	allTok := b.Token(t, store.RoleRead, "*")
	spec, err := filepath.Abs(filepath.Join("..", "..", "..", "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gp := func(tok string, code int, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GPUPASS_BROKER_URL=" + b.URL, "GPUPASS_BROKER_TOKEN=" + tok}
		stdout, stderr, got := testutil.Run(t, cmd)
		if got != code {
			t.Fatalf("gpupass %v: exit %d, want %d\n%s%s", args, got, code, stdout, stderr)
		}
		return stdout
	}
	check := func(doc, filter string) {
		t.Helper()
		cmd := exec.Command(jq, "-e", filter)
		cmd.Stdin = strings.NewReader(doc)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("jq -e '%s': %v\n%s\ndocument:\n%s", filter, err, out, doc)
		}
	}
	const rfc3339 = `test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?Z$")`

	nodes := gp(allTok, ExitOK, "nodes", "-o", "json")
	check(nodes, `.nodes | length == 3`)
	check(nodes, `.nodes[0] | (.gpu_count|type) == "number" and (.gpu_memory_mib|type) == "number" and (.rtt_ms|type) == "number" and (.health.launches_24h|type) == "number"`)
	check(nodes, `.nodes[0] | (.last_seen_at|`+rfc3339+`) and (.report_generated_at|`+rfc3339+`)`)
	check(nodes, `[.nodes[] | .admission] == ["admitted", "admitted", "admitted"]`)
	check(nodes, `[.nodes[] | select(.runtime.cuda == "12.2.140") | .region] == ["us-east-1"]`)

	dry := gp(usTok, ExitOK, "validate", "-o", "json", "-s", spec, "--dry-run")
	check(dry, `.dry_run | .candidates_total == 1 and .excluded_total == 2 and .min_health_score == 85`)
	check(dry, `.dry_run.candidates[0] | .region == "us-west-2" and .price_per_hour == 20 and (.health.score|type) == "number" and (.last_seen_at|`+rfc3339+`)`)
	check(dry, `.dry_run.candidates[0] | has("zone") or has("runtime") or has("storage_free_gb") | not`)
	check(dry, `[.dry_run.excluded[] | select(.node.out_of_scope) | .node | {region, keys: keys}] == [{"region": "eu-central-1", "keys": ["id", "out_of_scope", "region"]}]`)
	check(dry, `[.dry_run.excluded[].reasons[] | select(.field == "runtime.cuda") | .measured] == ["12.2.140"]`)
	// docs/using.md's examples, as written there.
	check(nodes, `.nodes[] | select(.online and .admission == "admitted") | "\(.id) \(.health.score)"`)
	check(dry, `.dry_run.excluded[] | "\(.node.id) \(.reasons[0].message)"`)

	// The rest of validate's document (findings, canonical spec) is
	// validate's own contract; the golden file holds the broker's part.
	var ind bytes.Buffer
	if err := json.Indent(&ind, mustField(t, dry, "dry_run"), "", "  "); err != nil {
		t.Fatal(err)
	}
	dryRun := ind.String() + "\n"
	for _, tt := range []struct{ name, doc string }{{"nodes", nodes}, {"dryrun", dryRun}} {
		if m := regexp.MustCompile(`unix_nano|"[0-9]+"`).FindString(tt.doc); m != "" {
			t.Errorf("%s -o json has protobuf JSON (%q):\n%s", tt.name, m, tt.doc)
		}
		got := normalizeJSON(t, tt.doc, ids)
		if tt.name == "nodes" {
			got = inRegistrationOrder(t, got, []string{"<node west>", "<node east>", "<node eu>"})
		}
		golden := filepath.Join("testdata", tt.name+".golden")
		if *updateGolden {
			if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), got); diff != "" {
			t.Errorf("%s (-want +got; run with -update if the change is meant):\n%s", golden, diff)
		}
	}

	// The documents decode into nodeview's types, every key known.
	strict(t, nodes, &nodeview.List{})
	strict(t, dryRun, &nodeview.DryRun{})
}

func strict(t *testing.T, doc string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Errorf("does not decode into %T: %v\n%s", v, err, doc)
	}
}

func mustField(t *testing.T, doc, key string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	return m[key]
}

// Values that change from run to run: when a node was seen or reported,
// and the measured round trip with the score terms computed from it.
var (
	varyingTime   = regexp.MustCompile(`("(?:last_seen_at|report_generated_at)": )"[^"]+"`)
	varyingNumber = regexp.MustCompile(`("(?:rtt_ms|latency_ms|latency_used_ms|latency_penalty|score)": )-?[0-9][0-9.eE+-]*`)
)

// normalizeJSON replaces node ids with their names, times with "<time>"
// and varying numbers with <number> (unquoted: a number was there),
// keeping the CLI's key order and layout.
func normalizeJSON(t *testing.T, doc string, ids map[string]string) string {
	t.Helper()
	if !json.Valid([]byte(doc)) {
		t.Fatalf("not JSON:\n%s", doc)
	}
	for id, name := range ids {
		doc = strings.ReplaceAll(doc, id, name)
	}
	doc = varyingTime.ReplaceAllString(doc, `$1"<time>"`)
	return varyingNumber.ReplaceAllString(doc, `$1<number>`)
}

// inRegistrationOrder puts the node objects of a normalized `nodes -o
// json` document (two-space indented, as the CLI prints it) in the order
// of names, their placeholder ids: the broker lists nodes in node id
// order, and it draws the ids at random, so the order the golden file
// holds is the test's registration order.
func inRegistrationOrder(t *testing.T, doc string, names []string) string {
	t.Helper()
	lines := strings.SplitAfter(doc, "\n")
	start, end := slices.Index(lines, "  \"nodes\": [\n"), slices.Index(lines, "  ],\n")
	if end < 0 {
		end = slices.Index(lines, "  ]\n")
	}
	if start < 0 || end < start {
		t.Fatalf("no nodes array in:\n%s", doc)
	}
	var blocks [][]string
	for _, l := range lines[start+1 : end] {
		if l == "    {\n" {
			blocks = append(blocks, nil)
		}
		if len(blocks) == 0 {
			t.Fatalf("a line outside the node objects: %q", l)
		}
		l = strings.TrimSuffix(l, "\n")
		if l == "    }," {
			l = "    }"
		}
		blocks[len(blocks)-1] = append(blocks[len(blocks)-1], l)
	}
	rank := func(b []string) int {
		for i, n := range names {
			if slices.Contains(b, `      "id": "`+n+`",`) {
				return i
			}
		}
		return len(names)
	}
	slices.SortStableFunc(blocks, func(a, b []string) int { return rank(a) - rank(b) })
	var out strings.Builder
	for _, l := range lines[:start+1] {
		out.WriteString(l)
	}
	for i, b := range blocks {
		for j, l := range b {
			out.WriteString(l)
			if j == len(b)-1 && i < len(blocks)-1 {
				out.WriteString(",")
			}
			out.WriteString("\n")
		}
	}
	for _, l := range lines[end:] {
		out.WriteString(l)
	}
	return out.String()
}
