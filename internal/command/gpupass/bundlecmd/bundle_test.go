package bundlecmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/bundlecmd"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := gpupass.Main(context.Background(), args, strings.NewReader(""), &out, &errb, gpupass.WithCommands(bundlecmd.Command))
	return code, out.String(), errb.String()
}

func TestBundleCommands(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	house := filepath.Join(dir, "house")
	if err := os.Mkdir(house, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, w := range [][2]string{{"alpha", "1.0"}, {"beta-pkg", "2.0"}} {
		if _, err := wheeltest.Simple(house, w[0], w[1]); err != nil {
			t.Fatal(err)
		}
	}
	specPath := filepath.Join(dir, "gpupass.yaml")
	if err := os.WriteFile(specPath, []byte(wheeltest.SpecYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.yaml")
	if err := os.WriteFile(short, []byte(strings.Replace(wheeltest.SpecYAML, "    - beta-pkg==2.0\n", "    - beta-pkg==2.0\n    - gamma==3.0\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ref := host + "/team/wheels:v1"

	// A wheelhouse with a stray file and a corrupt wheel: every problem
	// at once, exit 1, nothing tagged.
	bad := filepath.Join(dir, "bad")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := wheeltest.Simple(bad, "alpha", "1.0"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "gamma-3.0-py3-none-any.whl"), []byte("PK"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, "bundle", "push", "--no-cache", "--plain-http", "-w", bad, ref)
	if code != gpupass.ExitFindings || !strings.Contains(stderr, "notes.txt") {
		t.Fatalf("push of a bad wheelhouse: exit %d\n%s", code, stderr)
	}
	if err := os.Remove(filepath.Join(bad, "notes.txt")); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI(t, "bundle", "push", "--no-cache", "--plain-http", "-w", bad, ref)
	if code != gpupass.ExitFindings || !strings.Contains(stderr, "gamma-3.0-py3-none-any.whl: not a readable zip") || !strings.Contains(stderr, "nothing was tagged") {
		t.Fatalf("push with a corrupt wheel: exit %d\n%s", code, stderr)
	}

	// Incomplete coverage refuses to push and says what is missing.
	code, _, stderr = runCLI(t, "bundle", "push", "--no-cache", "--plain-http", "-w", house, "--spec", short, ref)
	if code != gpupass.ExitFindings || !strings.Contains(stderr, "gamma==3.0: no wheel") || !strings.Contains(stderr, "nothing was pushed") {
		t.Fatalf("incomplete push: exit %d, stderr:\n%s", code, stderr)
	}
	code, _, _ = runCLI(t, "bundle", "inspect", "--plain-http", ref)
	if code == 0 {
		t.Fatal("the tag exists after a refused push")
	}

	code, stdout, stderr := runCLI(t, "-o", "json", "bundle", "push", "--no-cache", "--plain-http", "-w", house, "--spec", specPath, ref)
	if code != 0 {
		t.Fatalf("push: exit %d\n%s", code, stderr)
	}
	var pushed struct {
		Reference   string            `json:"reference"`
		Digest      string            `json:"digest"`
		Annotations map[string]string `json:"annotations"`
		Coverage    *bundle.Coverage  `json:"coverage"`
	}
	if err := json.Unmarshal([]byte(stdout), &pushed); err != nil {
		t.Fatalf("push --output json is not JSON: %v\n%s", err, stdout)
	}
	if !strings.HasPrefix(pushed.Annotations[bundle.AnnotationFingerprint], "sha256:") || pushed.Coverage == nil || len(pushed.Coverage.Covered) != 2 {
		t.Errorf("push output = %+v", pushed)
	}
	// The fingerprint is the spec's, as `gpupass validate` prints it.
	_, vout, _ := runCLI(t, "-o", "json", "validate", "--spec", specPath)
	if !strings.Contains(vout, pushed.Annotations[bundle.AnnotationFingerprint]) {
		t.Errorf("bundle fingerprint %s not in validate's output:\n%s", pushed.Annotations[bundle.AnnotationFingerprint], vout)
	}

	// Text push prints REF@digest alone; progress lines go to stderr.
	code, stdout, stderr = runCLI(t, "bundle", "push", "--no-cache", "--plain-http", "-w", house, ref)
	if code != 0 || !strings.HasPrefix(stdout, host+"/team/wheels@sha256:") || !strings.Contains(stderr, "exists  alpha-1.0-py3-none-any.whl") {
		t.Errorf("text push: exit %d stdout %q stderr %q", code, stdout, stderr)
	}

	code, stdout, _ = runCLI(t, "bundle", "inspect", "--plain-http", pushed.Reference)
	if code != 0 || !strings.Contains(stdout, "beta_pkg-2.0-py3-none-any.whl") || !strings.Contains(stdout, bundle.ArtifactType) {
		t.Errorf("inspect: exit %d\n%s", code, stdout)
	}

	to := filepath.Join(dir, "pulled")
	code, stdout, stderr = runCLI(t, "bundle", "pull", "--plain-http", pushed.Reference, "--to", to)
	if code != 0 || !strings.Contains(stdout, "2 wheels in "+to) {
		t.Fatalf("pull: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, "bundle", "verify", to, "--spec", specPath)
	if code != 0 || !strings.Contains(stdout, "all 2 pinned packages covered") || !strings.Contains(stdout, "matching "+bundle.LockFile) {
		t.Errorf("verify: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = runCLI(t, "-o", "json", "bundle", "verify", to, "--spec", short)
	var v struct {
		OK       bool     `json:"ok"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(stdout), &v); err != nil || code != gpupass.ExitFindings || v.OK || len(v.Problems) != 1 {
		t.Errorf("verify of an incomplete wheelhouse: exit %d, %+v (%v)", code, v, err)
	}
	// A wheel swapped after the pull no longer matches the lock.
	swapped := t.TempDir()
	if _, err := wheeltest.Write(swapped, "alpha-1.0-py3-none-any.whl", "alpha", "1.0",
		[]wheeltest.File{{Name: "alpha/__init__.py", Data: strings.NewReader("EVIL = True\n")}}, wheeltest.Options{}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(swapped, "alpha-1.0-py3-none-any.whl"))
	if err != nil {
		t.Fatal(err)
	}
	tampered := filepath.Join(dir, "tampered")
	if code, _, stderr := runCLI(t, "bundle", "pull", "--plain-http", ref, "--to", tampered); code != 0 {
		t.Fatal(stderr)
	}
	if err := os.WriteFile(filepath.Join(tampered, "alpha-1.0-py3-none-any.whl"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ = runCLI(t, "bundle", "verify", tampered); code != gpupass.ExitFindings || !strings.Contains(stdout, "alpha-1.0-py3-none-any.whl: sha256:") {
		t.Errorf("verify of a tampered wheelhouse: exit %d\n%s", code, stdout)
	}
	// A second pull into the now full directory is refused.
	if code, _, stderr = runCLI(t, "bundle", "pull", "--plain-http", ref, "--to", to); code != gpupass.ExitUsage || !strings.Contains(stderr, "not empty") {
		t.Errorf("pull into a full dir: exit %d %s", code, stderr)
	}
}

func TestBundleFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"bundle", "push", "x/y:z"}, "--wheelhouse is required"},
		{[]string{"bundle", "pull", "x/y:z"}, "--to is required"},
		{[]string{"bundle", "push", "-w", ".", "-j", "0", "x/y:z"}, `--jobs "0": want 1 to 64`},
		{[]string{"bundle", "push", "-w", ".", "--registry-username", "u", "x/y:z"}, "go together"},
		{[]string{"bundle", "pull", "--to", "d", "Not A Ref!"}, "reference"},
	}
	for _, tt := range tests {
		code, _, stderr := runCLI(t, tt.args...)
		if code != gpupass.ExitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

// Not parallel: it sets GPUPASS_REGISTRY_* in the process environment.
func TestBundleRegistryCredentialsFromEnv(t *testing.T) {
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci-bot" || p != "t0ps3cret-value" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	house := t.TempDir()
	if _, err := wheeltest.Simple(house, "alpha", "1.0"); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(secret, []byte("wrong-password-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPUPASS_REGISTRY_USERNAME", "ci-bot")
	t.Setenv("GPUPASS_REGISTRY_PASSWORD_FILE", secret)
	code, stdout, stderr := runCLI(t, "-v", "bundle", "push", "--no-cache", "--plain-http", "-w", house, host+"/t/w:v1")
	if code == 0 || strings.Contains(stdout+stderr, "wrong-password-value") || !strings.Contains(stderr, "HTTP 401") {
		t.Fatalf("push with a wrong password: exit %d, output must name the 401 and never the secret:\n%s%s", code, stdout, stderr)
	}
	if err := os.WriteFile(secret, []byte("t0ps3cret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, "-v", "bundle", "push", "--no-cache", "--plain-http", "-w", house, host+"/t/w:v1")
	if code != 0 || strings.Contains(stdout+stderr, "t0ps3cret-value") {
		t.Fatalf("push with GPUPASS_REGISTRY_PASSWORD_FILE: exit %d\n%s%s", code, stdout, stderr)
	}
}
