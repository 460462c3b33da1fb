//go:build e2e

package main_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestWebhookWhenTrainGroupEnds is issue #35's loop with the built
// binaries: an operator adds a webhook with gpupass-broker, a user's
// gpupass train submits two regions as one group and prints it, and when
// both runs have ended (no node there: at once) the broker's signed event
// reaches the receiver once; runs --group lists the two runs and
// webhooks deliveries shows the attempt. The secret is in no output.
func TestWebhookWhenTrainGroupEnds(t *testing.T) {
	brokerBin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	gpupass := testutil.BuildBinary(t, "./cmd/gpupass")
	db := brokertest.NewDB(t, "sqlite").URL()
	dir := t.TempDir()
	const secret = "e2e-webhook-secret-0123456789abcdef"
	secretFile := filepath.Join(dir, "webhook.secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type event struct {
		header http.Header
		body   []byte
	}
	events := make(chan event, 4)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		events <- event{r.Header.Clone(), body}
	}))
	t.Cleanup(recv.Close)

	run := func(env []string, bin string, args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, out.String(), errb.String()
	}
	op := append(os.Environ(), "GPUPASS_DB="+db)
	code, out, errOut := run(op, brokerBin, "webhook", "add", "--url", recv.URL+"/gpupass", "--secret-file", secretFile)
	if code != 0 || strings.Contains(out+errOut, secret) {
		t.Fatalf("webhook add: exit %d\n%s\n%s", code, out, errOut)
	}
	tok := tokenCreate(t, brokerBin, db, "submit", "*")
	addr := freePort(t)
	p := serve(t, brokerBin, db, addr)

	user := append(os.Environ(), "GPUPASS_BROKER_URL=http://"+addr, "GPUPASS_BROKER_TOKEN="+tok)
	spec, err := filepath.Abs("../../broker/testdata/h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(user, gpupass, "train", "--spec", spec, "--no-workdir", "--region", "us-west-2", "--region", "eu-central-1", "--", "python3", "train.py")
	group := regexp.MustCompile(`run group (group-[0-9a-f]{16}): list it with gpupass runs --group (group-[0-9a-f]{16})`).FindStringSubmatch(out)
	if code != 1 || group == nil || group[1] != group[2] {
		t.Fatalf("train: exit %d (want 1: no node, both runs fail), no group line:\n%s\n%s", code, out, errOut)
	}
	var ev event
	select {
	case ev = <-events:
	case <-time.After(30 * time.Second):
		t.Fatalf("no webhook event\n%s", p.stderr.String())
	}
	if ev.header.Get(broker.HeaderSignature) != broker.Sign([]byte(secret), ev.body) || ev.header.Get(broker.HeaderEvent) != "group.ended" {
		t.Errorf("event headers %v do not verify with the secret", ev.header)
	}
	var ge broker.GroupEvent
	if err := json.Unmarshal(ev.body, &ge); err != nil || ge.Group != group[1] || len(ge.Runs) != 2 {
		t.Errorf("event = %s, %v; want group %s with 2 runs", ev.body, err, group[1])
	}

	// What the line said to run, as printed.
	code, out, errOut = run(user, gpupass, "runs", "--group", group[1], "-o", "json")
	var list struct {
		Runs []struct{ Group string } `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Runs) != 2 || list.Runs[0].Group != group[1] {
		t.Errorf("runs --group: exit %d, %v\n%s\n%s", code, err, out, errOut)
	}
	time.Sleep(3 * time.Second) // more sweeps: still one event
	if n := len(events); n != 0 {
		t.Errorf("%d more events for the group", n)
	}
	code, out, errOut = run(op, brokerBin, "webhooks", "deliveries")
	if code != 0 || !strings.Contains(out, group[1]) || !strings.Contains(out, "delivered") || !strings.Contains(out, " 200 ") {
		t.Errorf("webhooks deliveries: exit %d\n%s\n%s", code, out, errOut)
	}
	p.stop(t)
	if strings.Contains(p.stderr.String(), secret) {
		t.Errorf("the broker's log holds the webhook secret")
	}
}
