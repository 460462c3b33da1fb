package gpupass_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// TestBrokerRefusalsNameNoCommand: a broker's refusal says what is wrong
// in the API's terms (a server does not know its clients' commands or
// flags): the same refusal as the API answers it names no gpupass
// command, and as the CLI prints it, it adds the command that helps, which
// runs as printed (the broker from the environment, as a project has it
// from gpupass up's config).
func TestBrokerRefusalsNameNoCommand(t *testing.T) {
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	node := brokertest.Register(t, b.URL, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20)).ID
	admin := b.Token(t, store.RoleAdmin, "us-*")
	api, err := client.Dial(b.URL, client.Options{Token: admin})
	if err != nil {
		t.Fatal(err)
	}
	// A project: its spec is what gpupass validate reads.
	spec, err := os.ReadFile(writeH100Spec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	if err := os.WriteFile("gpupass.yaml", spec, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPUPASS_BROKER_URL", b.URL)
	t.Setenv("GPUPASS_BROKER_TOKEN", admin)
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		// call is the API's request; cli the same as the CLI's.
		call func() error
		cli  []string
		// hint is the CLI's command; pasted, it exits 0 and prints want.
		hint, want string
	}{
		{
			name: "approving a node outside the token's scope",
			call: func() error {
				_, err := api.Node.SetAdmission(ctx, connect.NewRequest(&gpupassv1.SetAdmissionRequest{NodeId: "agt-0000", Decision: "approve"}))
				return err
			},
			cli:  []string{"nodes", "approve", "agt-0000"},
			hint: "gpupass nodes", want: node,
		},
		{
			name: "a malformed spec fingerprint",
			call: func() error {
				_, err := api.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{SpecFingerprint: "sha256:12"}))
				return err
			},
			cli:  []string{"nodes", "--spec-fingerprint", "sha256:12"},
			hint: "gpupass validate", want: "fingerprint",
		},
		{
			// The CLI validates a spec itself before a dry run, and
			// prints the findings; the broker's answer lists its own.
			name: "dry run of an invalid spec",
			call: func() error {
				_, err := api.Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: []byte("name: x\n")}}))
				return err
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil {
				t.Fatal("the broker took it")
			}
			if strings.Contains(err.Error(), "gpupass ") {
				t.Errorf("the broker's refusal names a client command: %v", err)
			}
			if tt.cli == nil {
				return
			}
			code, out, errs := runMain(t, tt.cli...)
			if code == 0 || !strings.Contains(errs, "; "+tt.hint+" ") {
				t.Fatalf("gpupass %s: exit %d, want an error naming %q:\n%s%s", strings.Join(tt.cli, " "), code, tt.hint, out, errs)
			}
			code, out, errs = runMain(t, strings.Fields(tt.hint)[1:]...)
			if code != 0 || !strings.Contains(out, tt.want) {
				t.Errorf("%s as printed: exit %d, want %q in\n%s%s", tt.hint, code, tt.want, out, errs)
			}
		})
	}
}

// TestDryRunAdmissionReasonNamesApproveInTheCLI: a node pending admission
// is excluded with the broker's reason in the API's terms; the CLI's
// dry-run adds the command that admits it, which, pasted with an admin
// token, admits it.
func TestDryRunAdmissionReasonNamesApproveInTheCLI(t *testing.T) {
	cfg := brokertest.Fast()
	var err error
	if cfg.Admission, err = broker.ParseAdmission("eu-*=approve"); err != nil {
		t.Fatal(err)
	}
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	node := brokertest.Register(t, b.URL, b.Token(t, store.RoleAgent, "*"), brokertest.H100("eu-central-1", 20)).ID
	spec, err := os.ReadFile(writeH100Spec(t))
	if err != nil {
		t.Fatal(err)
	}
	read := b.Token(t, store.RoleRead, "*")
	dry, err := b.Clients(t, read).Node.DryRun(context.Background(), connect.NewRequest(&gpupassv1.DryRunRequest{Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: spec}}))
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range dry.Msg.GetExcluded() {
		for _, r := range x.GetReasons() {
			if strings.Contains(r.GetMessage(), "gpupass ") {
				t.Errorf("the broker's reason names a client command: %s", r.GetMessage())
			}
		}
	}
	t.Chdir(t.TempDir())
	if err := os.WriteFile("gpupass.yaml", spec, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPUPASS_BROKER_URL", b.URL)
	t.Setenv("GPUPASS_BROKER_TOKEN", read)
	_, out, errs := runMain(t, "validate", "--dry-run")
	hint := "gpupass nodes approve " + node
	if !strings.Contains(out, "pending admission (region eu-central-1 admits nodes by approval); to admit it: "+hint+"\n") {
		t.Fatalf("validate --dry-run does not name %q:\n%s%s", hint, out, errs)
	}
	t.Setenv("GPUPASS_BROKER_TOKEN", b.Token(t, store.RoleAdmin, "*"))
	if code, out, errs := runMain(t, strings.Fields(hint)[1:]...); code != 0 || !strings.Contains(out, node+" in eu-central-1: admitted") {
		t.Errorf("%s as printed: exit %d\n%s%s", hint, code, out, errs)
	}
}

// TestDryRunNamesTheContextsBroker: validate --dry-run against the broker
// of the current context (as gpupass up leaves one) names it in its
// header; it printed "dry-run at : 1 candidate(s)" when the URL came from
// no flag, read before the dry run resolved it.
func TestDryRunNamesTheContextsBroker(t *testing.T) {
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	brokertest.Register(t, b.URL, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
	spec, err := os.ReadFile(writeH100Spec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("GPUPASS_BROKER_URL", "")
	t.Setenv("GPUPASS_BROKER_TOKEN", "")
	if err := os.WriteFile("gpupass.yaml", spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("read.token", []byte(b.Token(t, store.RoleRead, "*")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"context", "add", "lab", "--broker-url", b.URL, "--token-file", "read.token"}, {"context", "use", "lab"}} {
		if code, out, errs := runMain(t, args...); code != 0 {
			t.Fatalf("gpupass %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
	}
	code, out, errs := runMain(t, "validate", "--dry-run", "--region", "us-west-2")
	if want := "dry-run at " + b.URL + ": 1 candidate(s)"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("validate --dry-run with the context's broker: exit %d, want %q in\n%s%s", code, want, out, errs)
	}
}
