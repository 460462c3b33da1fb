package gpupass_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/spec"
)

// TestTrainSendsTheSpecAsItsCanonicalJSON runs gpupass train against a
// real broker behind a loopback proxy that keeps the Submit requests as
// they crossed the wire: the CLI sends the spec's canonical JSON (the
// bytes the fingerprint is computed from) beside the file as written,
// and the broker stores and reports spec.Fingerprint of exactly those
// bytes, and keeps the file for the audit.
func TestTrainSendsTheSpecAsItsCanonicalJSON(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	fakeAgent(t, b.URL, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20), false)
	tok := b.Token(t, store.RoleSubmit, "*")
	target, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		sent []*gpupassv1.SubmitRequest
	)
	fwd := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == gpupassv1connect.RunServiceSubmitProcedure {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var req gpupassv1.SubmitRequest
			if ct := r.Header.Get("Content-Type"); ct != "application/proto" || proto.Unmarshal(body, &req) != nil {
				t.Errorf("Submit sent as %q, not a Connect proto message", ct)
			}
			mu.Lock()
			sent = append(sent, &req)
			mu.Unlock()
		}
		fwd.ServeHTTP(w, r)
	}))
	// The CLI speaks h2c to a loopback broker, as to the real one.
	proxy.Config.Protocols = new(http.Protocols)
	proxy.Config.Protocols.SetHTTP1(true)
	proxy.Config.Protocols.SetUnencryptedHTTP2(true)
	proxy.Start()
	t.Cleanup(proxy.Close)

	specPath := writeH100Spec(t)
	file, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runMain(t, "train", "--spec", specPath, "--region", "us-west-2", "--broker-url", proxy.URL, "--broker-token", tok,
		"--", "python3", "train.py")
	id := allocRE.FindString(out)
	if code != 0 || id == "" {
		t.Fatalf("train: exit %d\n%s\n%s", code, out, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 {
		t.Fatalf("train sent %d Submit requests, want 1", len(sent))
	}
	req := sent[0]
	if !bytes.Equal(req.SpecYaml, file) {
		t.Errorf("spec_yaml sent = %q, want the file as written %q", req.SpecYaml, file)
	}
	sp, err := spec.Decode(req.SpecJson)
	if err != nil {
		t.Fatalf("spec_json sent (%q) is not a spec: %v", req.SpecJson, err)
	}
	canon, err := spec.Encode(sp)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := spec.Fingerprint(sp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(canon, req.SpecJson) {
		t.Errorf("spec_json sent is not canonical:\n%s\nwant\n%s", req.SpecJson, canon)
	}
	if want := spec.Validate(specPath, file).Fingerprint; fp != want {
		t.Errorf("spec_json sent has fingerprint %s, the file %s", fp, want)
	}

	rc, err := client.DialRuns(b.URL, client.Options{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Run.GetRun(context.Background(), connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Store.(store.Runs).Alloc(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Msg.Run.GetSpecFingerprint(); got != fp || a.SpecFingerprint != fp || !bytes.Equal(a.SpecJSON, req.SpecJson) || !bytes.Equal(a.SpecYAML, file) {
		t.Errorf("broker stored fingerprint %s (run reports %s), spec_json equal %v, spec_yaml %q; want %s of the bytes the CLI sent, those bytes, the file",
			a.SpecFingerprint, got, bytes.Equal(a.SpecJSON, req.SpecJson), a.SpecYAML, fp)
	}
	if strings.Contains(out+errOut, tok) {
		t.Errorf("train printed the token")
	}
}
