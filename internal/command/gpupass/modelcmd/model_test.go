package modelcmd_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/auditcmd"
	"github.com/gpupass/gpupass/internal/command/gpupass/modelcmd"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := gpupass.Main(context.Background(), args, strings.NewReader(""), &out, &errb, gpupass.WithCommands(modelcmd.Command, auditcmd.Command))
	return code, out.String(), errb.String()
}

// Bad input is a usage error (exit 2) naming the flag or argument and the
// fix, found before the broker or the registry is asked for anything (the
// broker URL here answers nothing).
func TestModelUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, _, err := audit.WriteKeyPair(filepath.Join(dir, "cosign"), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "model.pt")
	if err := os.WriteFile(big, bytes.Repeat([]byte("w"), 2048), 0o644); err != nil {
		t.Fatal(err)
	}
	broker := []string{"--broker-url", "http://127.0.0.1:1", "--broker-token", "gpp_x"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"push without a key", []string{"model", "push", "alloc-1", "reg.example/m:v1"}, []string{"--key is required", "gpupass audit keygen"}},
		{"push without REF", []string{"model", "push", "alloc-1"}, []string{"want RUN REF"}},
		{"push to a digest", append([]string{"model", "push", "alloc-1", "reg.example/m@sha256:" + strings.Repeat("a", 64), "--key", key, "--file", big}, broker...), []string{"REF", "names a digest", "push to a tag"}},
		{"file over the limit", append([]string{"model", "push", "alloc-1", "reg.example/m:v1", "--key", key, "--file", big, "--max-size", "1KiB"}, broker...), []string{"--file", "2048 bytes, over the 1024 allowed", "raise --max-size"}},
		{"file missing", append([]string{"model", "push", "alloc-1", "reg.example/m:v1", "--key", key, "--file", filepath.Join(dir, "nope.pt")}, broker...), []string{"--file", "nope.pt", "no such file"}},
		{"a directory", append([]string{"model", "push", "alloc-1", "reg.example/m:v1", "--key", key, "--file", dir}, broker...), []string{"--file", "not a regular file"}},
		{"bad size", []string{"model", "push", "alloc-1", "reg.example/m:v1", "--key", key, "--max-size", "lots"}, []string{"--max-size \"lots\"", "500MiB"}},
		{"verify without a key", []string{"model", "verify", "reg.example/m:v1"}, []string{"--key is required", "cosign.pub"}},
		{"verify with a key and an identity", []string{"model", "verify", "reg.example/m:v1", "--key", key, "--certificate-identity", "https://github.com/o/r/.github/workflows/ci.yml@refs/heads/main", "--certificate-oidc-issuer", "https://token.actions.githubusercontent.com"}, []string{"--key and --certificate-identity exclude each other"}},
		{"verify with an identity and no issuer", []string{"model", "verify", "reg.example/m:v1", "--certificate-identity", "https://github.com/o/r/.github/workflows/ci.yml@refs/heads/main"}, []string{"--certificate-oidc-issuer is required with --certificate-identity"}},
		{"push with a key and keyless", []string{"model", "push", "alloc-1", "reg.example/m:v1", "--key", key, "--keyless"}, []string{"--key", "--keyless", "exclude each other"}},
		{"push keyless without an identity", []string{"model", "push", "alloc-1", "reg.example/m:v1", "--keyless"}, []string{"--keyless", "needs an OIDC token", "id-token: write"}},
		{"verify with a private key", []string{"model", "verify", "reg.example/m:v1", "--key", key}, []string{"--key", "not a PEM public key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runCLI(t, tc.args...)
			if code != gpupass.ExitUsage {
				t.Errorf("exit %d, want %d\n%s%s", code, gpupass.ExitUsage, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
		})
	}
}

// A registry that refuses the credentials: the error says what to do and
// never holds the password.
func TestModelVerifyNeverPrintsRegistryPassword(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, pub, err := audit.WriteKeyPair(filepath.Join(dir, "cosign"), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "s3cret-registry-token"
	host := regtest.StartInProcessRegistry(t, true, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "right" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	code, out, errOut := runCLI(t, "model", "verify", host+"/team/model:v1", "--key", pub, "--plain-http",
		"--registry-username", "ci", "--registry-password", secret, "-v")
	if code == 0 || strings.Contains(out+errOut, secret) || !strings.Contains(errOut, "401") {
		t.Errorf("exit %d, want a 401 failure without the password:\n%s%s", code, out, errOut)
	}
}

// --model-ref on train and audit (the steps' model-ref input) is refused,
// naming the flag (or the input, in a CI step) and the fix, before
// anything is submitted or audited, where the one run whose model to push
// is not known or its output could not be read.
func TestModelRefUsageErrors(t *testing.T) {
	t.Parallel()
	broker := []string{"--broker-url", "http://127.0.0.1:1", "--broker-token", "gpp_x"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"detached train", []string{"train", "--region", "us-west-2", "--model-ref", "r.test/m:v1", "--", "true"}, "--model-ref pushes the model once the run ended: it needs --follow"},
		{"detached train step", []string{"-o", "github", "train", "--region", "us-west-2", "--detach", "--model-ref", "r.test/m:v1", "--", "true"}, "--model-ref (GPUPASS_MODEL_REF, the model-ref input) pushes the model once the run ended: it needs --follow (GPUPASS_FOLLOW, the wait input)"},
		{"two regions", []string{"-o", "gitlab", "train", "--region", "us-west-2,eu-central-1", "--follow", "--model-ref", "r.test/m:v1", "--", "true"}, "--model-ref (GPUPASS_MODEL_REF, the model-ref input) pushes one run's model, and this step has 2 runs"},
		{"train -o json", []string{"-o", "json", "train", "--region", "us-west-2", "--follow", "--model-ref", "r.test/m:v1", "--", "true"}, "--model-ref with -o json would print two documents"},
		{"audit of a group", []string{"-o", "github", "audit", "group-0123456789abcdef", "--model-ref", "r.test/m:v1"}, "--model-ref (GPUPASS_MODEL_REF, the model-ref input) pushes one run's model, and group-0123456789abcdef is a run group"},
		{"audit -o json", []string{"-o", "json", "audit", "alloc-1", "--model-ref", "r.test/m:v1"}, "--model-ref with -o json would print two documents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{}, tc.args...)
			if i := slices.Index(args, "--"); i >= 0 {
				args = slices.Concat(args[:i], broker, args[i:])
			} else {
				args = append(args, broker...)
			}
			code, out, errOut := runCLI(t, args...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, want 2 with %q\nstdout: %s\nstderr: %s", code, tc.want, out, errOut)
			}
		})
	}
}
