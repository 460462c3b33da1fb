//go:build e2e

package agent_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// cleanEnv is the test's environment without GPUPASS_* variables, so
// only what a case sets configures the agent.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUPASS_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// TestOldTokenNamesOnBinary: the built agent takes its token as
// --broker-token (the CLI's name), and still as --token, GPUPASS_TOKEN
// and GPUPASS_TOKEN_FILE, saying what replaces them. With the token
// taken, the next missing flag (--region) is what the agent names.
func TestOldTokenNamesOnBinary(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass-agent")
	tokFile := t.TempDir() + "/token"
	if err := os.WriteFile(tokFile, []byte("gpa_x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--broker-url", "http://127.0.0.1:1", "--state-dir", t.TempDir()}
	tests := []struct {
		name       string
		args       []string
		env        []string
		want       string
		deprecated string
	}{
		{"new flag", []string{"--broker-token", "gpa_x"}, nil, "--region is required", ""},
		{"new env", nil, []string{"GPUPASS_BROKER_TOKEN=gpa_x"}, "--region is required", ""},
		{"new env file", nil, []string{"GPUPASS_BROKER_TOKEN_FILE=" + tokFile}, "--region is required", ""},
		{"old flag", []string{"--token", "gpa_x"}, nil, "--region is required", "Flag --token has been deprecated, use --broker-token"},
		{"old env", nil, []string{"GPUPASS_TOKEN=gpa_x"}, "--region is required", "GPUPASS_TOKEN is deprecated; use GPUPASS_BROKER_TOKEN"},
		{"old env file", nil, []string{"GPUPASS_TOKEN_FILE=" + tokFile}, "--region is required", "GPUPASS_TOKEN is deprecated; use GPUPASS_BROKER_TOKEN"},
		{"none", nil, nil, "--broker-token is required", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bin, append(append([]string{}, base...), tt.args...)...)
			cmd.Env = cleanEnv(tt.env...)
			out, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2\n%s", err, out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, out)
			}
			if tt.deprecated != "" && !strings.Contains(string(out), tt.deprecated) {
				t.Errorf("output lacks %q:\n%s", tt.deprecated, out)
			}
			if strings.Contains(string(out), "gpa_x") {
				t.Errorf("the token is echoed:\n%s", out)
			}
		})
	}
}

// TestOldRegistryPlainHTTPOnBinary: the built agent pulls bundles over
// plain HTTP with --plain-http (the CLI's name) and still with its old
// --registry-plain-http; it says so in its log before the query endpoint
// listens, and says nothing of it without either flag.
func TestOldRegistryPlainHTTPOnBinary(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass-agent")
	tests := []struct {
		name      string
		args      []string
		env       []string
		wantPlain bool
	}{
		{"new flag", []string{"--plain-http"}, nil, true},
		{"new env", nil, []string{"GPUPASS_PLAIN_HTTP=true"}, true},
		{"old flag", []string{"--registry-plain-http"}, nil, true},
		{"old env", nil, []string{"GPUPASS_REGISTRY_PLAIN_HTTP=true"}, true},
		{"none", nil, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// A bound, not a timing assertion: the lines come within
			// a second; a broken agent must not hang the test.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			args := append([]string{"--broker-url", "http://127.0.0.1:1", "--broker-token", "gpa_x", "--region", "r",
				"--state-dir", t.TempDir(), "--query-addr", "127.0.0.1:0", "--simulate", "h100-sxm5-8x", "--read-probe-mb", "1"}, tt.args...)
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Env = cleanEnv(tt.env...)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			var log strings.Builder
			plain := false
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				log.WriteString(sc.Text() + "\n")
				plain = plain || strings.Contains(sc.Text(), "pulled over plain HTTP")
				if strings.Contains(sc.Text(), "query endpoint listening") {
					break
				}
			}
			if !strings.Contains(log.String(), "query endpoint listening") {
				t.Fatalf("the agent did not start:\n%s", log.String())
			}
			if plain != tt.wantPlain {
				t.Errorf("plain HTTP warning %t, want %t:\n%s", plain, tt.wantPlain, log.String())
			}
		})
	}
}
