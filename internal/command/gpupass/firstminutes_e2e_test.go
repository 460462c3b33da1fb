//go:build e2e

package gpupass

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
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

// closedURL returns the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	return url
}

// TestFirstMinutes runs the built gpupass the way a newcomer does in the
// first minutes (issue #17, item 5) and checks each message says what
// happened and what to do next.
func TestFirstMinutes(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	brokerBin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	ctx := context.Background()

	// A broker with no node enrolled, and a run in eu-central-1 for the
	// scope case.
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	readTok := b.Token(t, store.RoleRead, "*")
	usReadTok := b.Token(t, store.RoleRead, "us-*")
	submitter, err := client.DialRuns(b.URL, client.Options{Token: b.Token(t, store.RoleSubmit, "eu-*")})
	if err != nil {
		t.Fatal(err)
	}
	specYAML, err := os.ReadFile(filepath.Join("..", "..", "..", "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := submitter.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: specYAML, Region: "eu-central-1", Command: []string{"true"}}))
	if err != nil {
		t.Fatal(err)
	}
	euRun := sub.Msg.Run.Id

	// A project made by init, a signing key and an offline run record.
	fixture := auditFixture(t)
	proj := filepath.Join(t.TempDir(), "proj")
	if out, err := exec.Command(bin, "init", proj).CombinedOutput(); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	empty := t.TempDir()
	down := closedURL(t)

	tests := []struct {
		name    string
		bin     string
		dir     string
		env     []string
		args    []string
		code    int
		want    []string // in stdout+stderr
		notWant []string
		files   []string // written into dir
		noFiles []string // not written into dir
	}{
		{name: "broker down", dir: empty, env: []string{"GPUPASS_BROKER_TOKEN=x"},
			args: []string{"runs", "--broker-url", down}, code: ExitUsage,
			want:    []string{"listing runs at " + down + ": no broker answers there", "connection refused", "`gpupass up`", "`gpupass-broker serve`"},
			notWant: []string{"(503", "unavailable"}},
		{name: "train without a spec", dir: empty, args: []string{"train", "--region", "us-west-2", "--broker-url", down, "--broker-token", "x", "--", "true"},
			code: ExitUsage,
			// The train use case names its Spec option; the CLI says --spec.
			want:    []string{`--spec "gpupass.yaml": no gpupass.yaml in ` + empty, "run `gpupass init` for a starter spec, or name another spec file"},
			notWant: []string{"open gpupass.yaml"}},
		{name: "audit without ALLOC", dir: empty, args: []string{"audit"}, code: ExitUsage,
			want: []string{"missing ALLOC", "gpupass audit ALLOC", "gpupass runs"}, notWant: []string{"accepts 1 arg"}},
		{name: "logs without ALLOC", dir: empty, args: []string{"logs"}, code: ExitUsage,
			want: []string{"missing ALLOC", "gpupass logs ALLOC"}, notWant: []string{"accepts 1 arg"}},
		{name: "init in the working directory", dir: proj, args: []string{"init"}, code: ExitOK,
			want: []string{"kept gpupass.yaml (it exists; --force overwrites it)", "kept train.py", "Next: gpupass validate"}, notWant: []string{"cd ."}},
		{name: "dry-run with no node enrolled", dir: proj, env: []string{"GPUPASS_BROKER_URL=" + b.URL, "GPUPASS_BROKER_TOKEN=" + readTok},
			args: []string{"validate", "--dry-run", "--region", "us-west-2"}, code: ExitFindings,
			want: []string{"0 candidate(s)", "no node is enrolled at " + b.URL, "gpupass-agent --broker-url", "`gpupass up`"}},
		{name: "limit past the broker's cap", dir: empty, args: []string{"runs", "--limit", "5000", "--broker-url", b.URL, "--broker-token", readTok},
			code: ExitUsage, want: []string{"--limit 5000: must be 1 to 1000"}},
		{name: "misspelt variable", dir: empty, env: []string{"GPUPASS_BROKR_URL=" + b.URL, "GPUPASS_REGIONS=x"}, args: []string{"version"},
			code: ExitOK, want: []string{"warning: GPUPASS_BROKR_URL is not a gpupass setting and is ignored; did you mean GPUPASS_BROKER_URL?"},
			notWant: []string{"GPUPASS_REGIONS"}},
		// Issue #32, item 10: two letters swapped is one edit, and the
		// value (maybe a secret) is never echoed.
		{name: "transposed variable", dir: empty, env: []string{"GPUPASS_SPCE=gpp_notshown"}, args: []string{"version"},
			code: ExitOK, want: []string{"warning: GPUPASS_SPCE is not a gpupass setting and is ignored; did you mean GPUPASS_SPEC?"},
			notWant: []string{"gpp_notshown"}},
		// Issue #33, item 4: -o is the output format everywhere; a zip
		// given to it is refused with --out as the fix, before any work.
		{name: "audit -o a zip names --out", dir: fixture, env: []string{"COSIGN_PASSWORD=gpupass-test"},
			args: []string{"audit", "alloc-7f3a", "--run-file", "run.json", "--key", "cosign.key", "-o", "a.zip"}, code: ExitUsage,
			want:    []string{"-o a.zip: --output is the output format (text, json, github or gitlab); write the zip with --out a.zip"},
			notWant: []string{"wrote"}, noFiles: []string{"a.zip"}},
		{name: "audit with a token of another region", dir: fixture, env: []string{"COSIGN_PASSWORD=gpupass-test"},
			args: []string{"audit", euRun, "--broker-url", b.URL, "--broker-token", usReadTok, "--key", "cosign.key"}, code: ExitUsage,
			want: []string{"outside the scope of token", "(403 permission_denied)"}, notWant: []string{"(404", "not_found"}},
		{name: "bundle verify help", dir: empty, args: []string{"bundle", "verify", "--help"}, code: ExitOK,
			want: []string{"--allow-incomplete   exit 0 when the wheelhouse does not cover"}, notWant: []string{"push even"}},
		{name: "broker token create help", bin: brokerBin, dir: empty, args: []string{"token", "create", "--help"}, code: ExitOK,
			want: []string{"--note string"}, notWant: []string{"--note token list"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := bin
			if tc.bin != "" {
				b = tc.bin
			}
			cmd := exec.Command(b, tc.args...)
			cmd.Dir = tc.dir
			// A clean environment: no GPUPASS_* of the machine running the test.
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + tc.dir}, tc.env...)
			stdout, stderr, code := testutil.Run(t, cmd)
			all := stdout + stderr
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s", code, tc.code, all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(all, w) {
					t.Errorf("output has %q:\n%s", w, all)
				}
			}
			for _, f := range tc.files {
				if _, err := os.Stat(filepath.Join(tc.dir, f)); err != nil {
					t.Errorf("wrote no %s: %v", f, err)
				}
			}
			for _, f := range tc.noFiles {
				if _, err := os.Stat(filepath.Join(tc.dir, f)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("wrote %s (or cannot tell: %v)", f, err)
				}
			}
		})
	}
}
