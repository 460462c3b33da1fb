//go:build e2e

package gpupass

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestRunsJSONThroughJq drives the built gpupass against a real broker and
// pipes `train`, `runs` and `cancel -o json` through the real jq, the way
// docs/using.md shows (issue #17, item 5): states in lower case, counts as
// numbers, RFC 3339 times, snake_case keys, and the same document decodes
// into runview's types. The node is a registered stand-in that never polls,
// so the run stays matched until it is cancelled.
func TestRunsJSONThroughJq(t *testing.T) {
	t.Parallel()
	jq := testutil.Tool(t, "jq")
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	submitTok := b.Token(t, store.RoleSubmit, "eu-*")
	node := brokertest.Register(t, b.URL, b.Token(t, store.RoleAgent, "eu-*"), brokertest.H100("eu-central-1", 2.5))
	spec, err := filepath.Abs(filepath.Join("..", "..", "..", "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gp := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GPUPASS_BROKER_URL=" + b.URL, "GPUPASS_BROKER_TOKEN=" + submitTok}
		stdout, stderr, code := testutil.Run(t, cmd)
		if code != ExitOK {
			t.Fatalf("gpupass %v: exit %d\n%s%s", args, code, stdout, stderr)
		}
		return stdout
	}
	// jq -e exits 1 when the filter's last output is false or null.
	check := func(doc, filter string) string {
		t.Helper()
		cmd := exec.Command(jq, "-e", "-r", filter)
		cmd.Stdin = strings.NewReader(doc)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("jq -e '%s': %v\n%s\ndocument:\n%s", filter, err, out, doc)
		}
		return strings.TrimSpace(string(out))
	}
	const rfc3339 = `test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?Z$")`

	train := gp("train", "-o", "json", "-s", spec, "--region", "eu-central-1", "--name", "jq", "--", "python3", "train.py")
	id := check(train, `.runs[0].id`)
	check(train, `.runs | length == 1`)
	check(train, `.runs[0] | .state == "matched" and .region == "eu-central-1" and .node_id == "`+node.ID+`" and .price_per_hour == 2.5`)
	check(train, `.runs[0] | (.attempts|type) == "number" and (.max_price|type) == "number" and (.log.last_seq|type) == "number"`)
	check(train, `.runs[0].score | (.score|type) == "number" and (.launches_24h|type) == "number" and .score > 0`)
	check(train, `.runs[0] | (.created_at|`+rfc3339+`) and .started_at == null and .finished_at == null`)
	check(train, `.runs[0] | .command == ["python3", "train.py"] and .replaced_nodes == [] and (.spec_fingerprint|startswith("sha256:"))`)

	runs := gp("runs", "-o", "json")
	check(runs, `[.runs[] | select(.state == "matched") | .id] == ["`+id+`"]`)

	cancel := gp("cancel", id, "-o", "json")
	check(cancel, `.id == "`+id+`" and (.cancel_requested or .state == "cancelled") and (.updated_at|`+rfc3339+`)`)

	// No protobuf spellings anywhere: enum names, nanosecond epochs,
	// int64 as strings.
	for name, doc := range map[string]string{"train": train, "runs": runs, "cancel": cancel} {
		if m := regexp.MustCompile(`ALLOC_STATE_|unix_nano|"[0-9]+"`).FindString(doc); m != "" {
			t.Errorf("%s -o json has protobuf JSON (%q):\n%s", name, m, doc)
		}
		var v any = &runview.List{}
		if name == "cancel" {
			v = &runview.Run{}
		}
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Errorf("%s -o json does not decode into runview's types: %v", name, err)
		}
	}
}

// TestShortFlags checks the short flags on the built binary: -f is
// --follow (logs, train) and -s is --spec (validate, bundle, train), with
// -f for --spec in validate and bundle still working and a deprecation
// note on stderr only, so -o json stays JSON on stdout.
func TestShortFlags(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	proj := filepath.Join(t.TempDir(), "proj")
	if out, err := exec.Command(bin, "init", proj).CombinedOutput(); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	empty := t.TempDir()
	const note = "warning: -f for --spec is deprecated and will be removed: use -s or --spec"
	tests := []struct {
		name      string
		dir       string
		env       []string
		args      []string
		code      int
		stdout    []string
		stderr    []string
		notStderr []string
		json      bool
	}{
		{name: "validate -s", dir: empty, args: []string{"validate", "-s", filepath.Join(proj, "gpupass.yaml")}, code: ExitOK,
			stdout: []string{"sha256:"}, notStderr: []string{"deprecated"}},
		{name: "validate -f still works, with a note", dir: empty, args: []string{"validate", "-f", filepath.Join(proj, "gpupass.yaml")}, code: ExitOK,
			stdout: []string{"sha256:"}, stderr: []string{note}},
		{name: "validate -f -o json: JSON alone on stdout", dir: empty, args: []string{"validate", "-o", "json", "-f", filepath.Join(proj, "gpupass.yaml")}, code: ExitOK,
			json: true, stderr: []string{note}},
		{name: "validate -f wins over GPUPASS_SPEC", dir: empty, env: []string{"GPUPASS_SPEC=" + filepath.Join(empty, "missing.yaml")},
			args: []string{"validate", "-f", filepath.Join(proj, "gpupass.yaml")}, code: ExitOK, stdout: []string{"sha256:"}},
		{name: "train -s is the spec", dir: empty, args: []string{"train", "-s", "nope.yaml", "--region", "us", "--broker-url", closedURL(t), "--", "true"},
			code: ExitUsage, stderr: []string{"no nope.yaml in"}},
		{name: "train help", dir: empty, args: []string{"train", "--help"}, code: ExitOK,
			stdout: []string{"-f, --follow", "-s, --spec string"}},
		{name: "logs help", dir: empty, args: []string{"logs", "--help"}, code: ExitOK, stdout: []string{"-f, --follow"}},
		{name: "validate help hides the old spelling", dir: empty, args: []string{"validate", "--help"}, code: ExitOK,
			stdout: []string{"-s, --spec string"}},
		{name: "bundle verify -f still works", dir: empty, args: []string{"bundle", "verify", empty, "-f", filepath.Join(proj, "gpupass.yaml"), "--allow-incomplete"},
			code: ExitFindings, stdout: []string{"is empty"}, stderr: []string{note}},
		{name: "bundle push help", dir: empty, args: []string{"bundle", "push", "--help"}, code: ExitOK, stdout: []string{"-s, --spec string"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, tc.args...)
			cmd.Dir = tc.dir
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + tc.dir}, tc.env...)
			stdout, stderr, code := testutil.Run(t, cmd)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout, stderr)
			}
			for _, w := range tc.stdout {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			for _, w := range tc.stderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			for _, w := range tc.notStderr {
				if strings.Contains(stderr, w) {
					t.Errorf("stderr has %q:\n%s", w, stderr)
				}
			}
			if strings.Contains(stdout+stderr, "deprecated-f-spec") {
				t.Errorf("the hidden alias flag shows:\n%s%s", stdout, stderr)
			}
			if tc.json && !json.Valid([]byte(stdout)) {
				t.Errorf("stdout is not JSON:\n%s", stdout)
			}
		})
	}
}
