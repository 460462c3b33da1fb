//go:build e2e

package gpupass

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// Issue #32 item 3: which broker a command talks to, for each source,
// on the built binary in a clean HOME. Every broker is a closed loopback
// port of its own, so the error names the one that was picked.
func TestE2EContextPrecedence(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	home := t.TempDir()
	cfgHome := filepath.Join(home, ".config")
	flagURL, envURL, ctxURL, projURL, curURL, stateURL := closedURL(t), closedURL(t), closedURL(t), closedURL(t), closedURL(t), closedURL(t)

	// A project whose stack config is in proj/.gpupass, a git repository
	// nested in it (a .gpupass above a git root is another project's),
	// a state dir elsewhere, and a dir outside any project.
	proj := filepath.Join(home, "proj")
	sub := filepath.Join(proj, "src", "deep")
	nested := filepath.Join(proj, "vendor", "lib")
	other := filepath.Join(home, "elsewhere")
	stateDir := filepath.Join(home, "state")
	for _, d := range []string{filepath.Join(proj, ".gpupass"), sub, filepath.Join(nested, ".git"), other, stateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for dir, url := range map[string]string{filepath.Join(proj, ".gpupass"): projURL, stateDir: stateURL} {
		if _, err := writeLocalConfig(dir, &LocalConfig{BrokerURL: url, Token: "gpp_stack", StateDir: dir}); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := filepath.Join(home, "tok")
	if err := os.WriteFile(tokenFile, []byte("gpp_ctx\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + cfgHome}
	gp := func(t *testing.T, dir string, extraEnv []string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir, cmd.Env = dir, append(append([]string{}, env...), extraEnv...)
		stdout, stderr, code := testutil.Run(t, cmd)
		return stdout + stderr, code
	}
	// Two contexts, added the way a user does; the first added is current.
	for _, c := range [][]string{
		{"context", "set", "cur", "--broker-url", curURL, "--token-file", tokenFile},
		{"context", "set", "ctx", "--broker-url", ctxURL, "--token-file", tokenFile},
		{"context", "set", "gone", "--broker-url", ctxURL, "--token-file", tokenFile},
	} {
		if out, code := gp(t, home, nil, c...); code != 0 {
			t.Fatalf("gpupass %s: exit %d\n%s", strings.Join(c, " "), code, out)
		}
	}
	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "tok2"), []byte("gpp_ctx\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cur", "ctx"} {
		if out, code := gp(t, home, nil, "context", "set", c, "--token-file", "tok2"); code != 0 {
			t.Fatalf("context set %s --token-file: exit %d\n%s", c, code, out)
		}
	}

	flags := []string{"--broker-url", flagURL, "--broker-token", "gpp_flag"}
	envBroker := []string{"GPUPASS_BROKER_URL=" + envURL, "GPUPASS_BROKER_TOKEN=gpp_env"}
	tests := []struct {
		name string
		dir  string
		env  []string
		args []string
		want []string
	}{
		{"flags beat everything", sub, append(envBroker, "GPUPASS_CONTEXT=ctx"), append(flags, "--context", "ctx"), []string{flagURL}},
		{"GPUPASS_BROKER_URL beats --context", sub, envBroker, []string{"--context", "ctx"}, []string{envURL}},
		{"--context beats the project's .gpupass", sub, nil, []string{"--context", "ctx"}, []string{ctxURL}},
		{"GPUPASS_CONTEXT beats the project's .gpupass", sub, []string{"GPUPASS_CONTEXT=ctx"}, nil, []string{ctxURL}},
		{"--context beats GPUPASS_CONTEXT", sub, []string{"GPUPASS_CONTEXT=cur"}, []string{"--context", "ctx"}, []string{ctxURL}},
		{"the project's .gpupass from a subdirectory", sub, nil, nil, []string{projURL}},
		{"the project's .gpupass beats the current context", proj, nil, nil, []string{projURL}},
		{"GPUPASS_STATE_DIR names the stack", other, []string{"GPUPASS_STATE_DIR=" + stateDir}, nil, []string{stateURL}},
		{"not past a git root: the current context", nested, nil, nil, []string{curURL}},
		{"outside any project: the current context", other, nil, nil, []string{curURL}},
		{"an unknown context", sub, nil, []string{"--context", "nope"}, []string{`--context: no context "nope"`, "there are: cur, ctx, gone", "gpupass context ls"}},
		{"a context whose token file is gone", other, nil, []string{"--context", "gone"}, []string{`context "gone": token file ` + tokenFile + ": no such file or directory", "gpupass context set gone --token-file FILE"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, code := gp(t, tc.dir, tc.env, append(tc.args, "nodes")...)
			if code != ExitUsage {
				t.Errorf("exit %d, want %d (no broker answers)\n%s", code, ExitUsage, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "gpp_") {
				t.Errorf("a token is in the output:\n%s", out)
			}
		})
	}

	// With no config file and no project, the error says every way out.
	t.Run("nothing anywhere", func(t *testing.T) {
		t.Parallel()
		cmd := exec.Command(bin, "nodes")
		cmd.Dir, cmd.Env = other, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
		stdout, stderr, code := testutil.Run(t, cmd)
		for _, w := range []string{"no broker: pass --broker-url URL", "gpupass context use NAME", "gpupass up"} {
			if !strings.Contains(stdout+stderr, w) || code != ExitUsage {
				t.Errorf("exit %d, output lacks %q:\n%s%s", code, w, stdout, stderr)
			}
		}
	})
}
