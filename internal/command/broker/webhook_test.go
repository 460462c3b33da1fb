package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	daemon "github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// Issue #35: an operator adds a webhook to a running broker's store, a
// group ends, and `webhooks deliveries` shows the attempt; the secret is
// never printed, the URL's query values are hidden, bad input names the
// flag and the fix.
func TestWebhookCommands(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	const secret = "a-webhook-secret-of-32-characters"
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "webhook.secret")
	short := filepath.Join(dir, "short.secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan http.Header, 4)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	t.Cleanup(recv.Close)

	db := brokertest.NewDB(t, "sqlite")
	cfg := brokertest.Fast()
	cfg.Webhooks = daemon.WebhookConfig{Sweep: 50 * time.Millisecond, Settle: 10 * time.Millisecond}
	b := brokertest.Start(t, db, cfg)

	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"plain http off loopback", []string{"--url", "http://ci.example.com/hook", "--secret-file", secretFile}, "--url http://ci.example.com/hook: plain http:// is allowed only to a loopback host"},
		{"no url", []string{"--secret-file", secretFile}, "--url is required"},
		{"no secret", []string{"--url", recv.URL}, "--secret-file is required"},
		{"short secret", []string{"--url", recv.URL, "--secret-file", short}, "--secret-file " + short + ": the secret is shorter than 16 bytes: write a new one with openssl rand -hex 32 > " + short},
		{"credentials in the URL", []string{"--url", "https://user:pw@ci.example.com/", "--secret-file", secretFile}, "credentials in the URL"},
	} {
		code, out, errOut := run(append([]string{"webhook", "add", "--db", db.URL()}, tt.args...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, tt.want) || strings.Contains(errOut, "pw@") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 2 and %q", tt.name, code, out, errOut, tt.want)
		}
	}

	code, out, errOut := run("webhook", "add", "--db", db.URL(), "--url", recv.URL+"/hook?token=glptt-trigger", "--secret-file", secretFile, "-o", "json")
	var added []webhookJSON
	if err := json.Unmarshal([]byte(out), &added); code != 0 || err != nil || len(added) != 1 {
		t.Fatalf("webhook add: exit %d, %v\n%s\n%s", code, err, out, errOut)
	}
	for _, args := range [][]string{{"webhook", "list"}, {"webhook", "list", "-o", "json"}} {
		code, out, _ := run(append(args, "--db", db.URL())...)
		if code != 0 || !strings.Contains(out, added[0].ID) || strings.Contains(out, secret) || strings.Contains(out, "glptt-trigger") || !strings.Contains(out, "REDACTED") {
			t.Errorf("%v: exit %d; want the webhook, its query hidden, never the secret:\n%s", args, code, out)
		}
	}

	c, err := client.DialRuns(b.URL, client.Options{Token: b.Token(t, store.RoleSubmit, "*")})
	if err != nil {
		t.Fatal(err)
	}
	// No node in the region: the run fails at once, its group ends.
	spec, err := os.ReadFile("../../../broker/testdata/h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run.Submit(context.Background(), connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: spec, Region: "us-west-2", Command: []string{"true"}})); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-got:
		if !strings.HasPrefix(h.Get(daemon.HeaderSignature), "sha256=") {
			t.Errorf("delivery headers %v", h)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery reached the receiver")
	}
	var list []deliveryJSON
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, out, errOut = run("webhooks", "deliveries", "--db", db.URL(), "--webhook", added[0].ID, "-o", "json")
		if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil {
			t.Fatalf("webhooks deliveries: exit %d, %v\n%s\n%s", code, err, out, errOut)
		}
		if len(list) == 1 && list[0].State == "delivered" || time.Now().After(deadline) {
			break
		}
	}
	if len(list) != 1 || list[0].State != "delivered" || len(list[0].Attempts) != 1 || list[0].Attempts[0].Status != 200 {
		t.Errorf("deliveries = %+v; want one delivered at its first attempt (200)", list)
	}
	code, out, _ = run("webhooks", "deliveries", "--db", db.URL())
	if code != 0 || !strings.Contains(out, "delivered") || !strings.Contains(out, "200") {
		t.Errorf("webhooks deliveries (text): exit %d\n%s", code, out)
	}
	code, out, _ = run("webhook", "rm", added[0].ID, "--db", db.URL(), "-o", "json")
	var removed struct{ Removed string }
	if err := json.Unmarshal([]byte(out), &removed); code != 0 || err != nil || removed.Removed != added[0].ID {
		t.Errorf("webhook rm -o json: exit %d, %v: %q; want only {\"removed\": %q}", code, err, out, added[0].ID)
	}
	code, out, _ = run("webhook", "add", "--db", db.URL(), "--url", recv.URL+"/other", "--secret-file", secretFile, "-o", "json")
	var other []webhookJSON
	if err := json.Unmarshal([]byte(out), &other); code != 0 || err != nil || len(other) != 1 {
		t.Fatalf("webhook add: exit %d, %v\n%s", code, err, out)
	}
	code, out, _ = run("webhook", "rm", other[0].ID, "--db", db.URL())
	if code != 0 || out != "removed "+other[0].ID+"\n" {
		t.Errorf("webhook rm: exit %d %q", code, out)
	}
	if code, _, errOut := run("webhook", "rm", added[0].ID, "--db", db.URL()); code != 2 || !strings.Contains(errOut, "gpupass-broker webhook list") {
		t.Errorf("webhook rm of a removed webhook: exit %d %q", code, errOut)
	}
}
