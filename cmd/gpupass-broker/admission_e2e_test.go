//go:build e2e

package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
)

// approveRE finds the command a pending node's line tells the user to run.
var approveRE = regexp.MustCompile(`gpupass nodes approve agt-[0-9a-f]+`)

// TestNodeAdmissionByApproval is issue #31's finding 7 (node admission) as
// an operator meets it, with the built binaries: the broker admits eu-*
// nodes by approval (GPUPASS_ADMISSION, as a deployment sets it); nodes
// enrolled with an agent token are listed as pending with the command
// that admits them; an agent-token holder's node declaring a low price
// gets no run while pending; the command, pasted into a shell with an
// admin token, admits it, and the next run goes to it.
func TestNodeAdmissionByApproval(t *testing.T) {
	broker := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	gpupass := testutil.BuildBinary(t, "./cmd/gpupass")
	db := brokertest.NewDB(t, "sqlite").URL()
	agentTok := tokenCreate(t, broker, db, "agent", "*")
	readTok := tokenCreate(t, broker, db, "read", "eu-*")
	adminTok := tokenCreate(t, broker, db, "admin", "eu-*")
	submitTok := tokenCreate(t, broker, db, "submit", "eu-*")
	dir := t.TempDir()
	tokFile := func(name, tok string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	readFile, adminFile := tokFile("read", readTok), tokFile("admin", adminTok)
	addr := freePort(t)
	p := serve(t, broker, db, addr, "GPUPASS_ADMISSION=eu-*=approve")
	url := "http://" + addr

	// The user's shell: the gpupass on PATH, the broker in the environment.
	env := func(tokenFile string) []string {
		return append(os.Environ(), "PATH="+filepath.Dir(gpupass)+":"+os.Getenv("PATH"),
			"GPUPASS_BROKER_URL="+url, "GPUPASS_BROKER_TOKEN_FILE="+tokenFile)
	}
	nodes := func() string {
		t.Helper()
		cmd := exec.Command(gpupass, "nodes")
		cmd.Env = env(readFile)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gpupass nodes: %v\n%s", err, out)
		}
		return string(out)
	}
	// paste runs the approve command shown on id's line of gpupass nodes,
	// as printed, in a shell with an admin token.
	paste := func(id string) {
		t.Helper()
		out := nodes()
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, id) {
				line = l
			}
		}
		hint := approveRE.FindString(line)
		if !strings.Contains(line, "pending admission") || hint != "gpupass nodes approve "+id {
			t.Errorf("gpupass nodes shows no pending admission and approve command for %s:\n%s", id, out)
			return
		}
		cmd := exec.Command("sh", "-c", hint)
		cmd.Env = env(adminFile)
		got, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(got), id+" in eu-central-1: admitted") {
			t.Fatalf("pasting %q: %v\n%s", hint, err, got)
		}
	}
	ctx := context.Background()
	runs, err := client.DialRuns(url, client.Options{Token: submitTok})
	if err != nil {
		t.Fatal(err)
	}
	specYAML, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	submit := func() string {
		t.Helper()
		sub, err := runs.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
			SpecYaml: specYAML, Region: "eu-central-1", Command: []string{"python3", "train.py"}}))
		if err != nil {
			t.Fatalf("submit: %v", err)
		}
		return sub.Msg.Run.NodeId
	}

	// The operator's own node, approved with the command it is shown.
	own := brokertest.Register(t, url, agentTok, brokertest.H100("eu-central-1", 20))
	paste(own.ID)
	// Another agent-token holder's node, cheaper than any.
	cheap := brokertest.Register(t, url, agentTok, brokertest.H100("eu-central-1", 2))
	if got := submit(); got != own.ID {
		t.Errorf("run 1 placed on %q, want the approved node %s: the cheap node %s is pending admission", got, own.ID, cheap.ID)
	}
	paste(cheap.ID)
	if got := submit(); got != cheap.ID {
		t.Errorf("run 2, after the pasted approve command, placed on %q; want %s", got, cheap.ID)
	}
	// A read token cannot approve, and is told what can.
	cmd := exec.Command(gpupass, "nodes", "approve", cheap.ID)
	cmd.Env = env(readFile)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "needs role admin") {
		t.Errorf("approve with a read token: %v\n%s", err, out)
	}
	p.stop(t)
	log := p.stderr.String()
	if !strings.Contains(log, "node takes no runs until an admin admits it") || !strings.Contains(log, "gpupass nodes approve "+cheap.ID) {
		t.Errorf("the broker log does not say the cheap node waits for admission, and how to admit it:\n%s", log)
	}
	for _, tok := range []string{agentTok, readTok, adminTok, submitTok} {
		if strings.Contains(log, tok) {
			t.Error("a token appears in the broker log")
		}
	}
}
