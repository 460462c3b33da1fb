//go:build e2e

package gpupass

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
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
		{"an environment token never goes to the project's broker", sub, []string{"GPUPASS_BROKER_TOKEN=gpp_env"}, nil,
			[]string{"--broker-token (or GPUPASS_BROKER_TOKEN or GPUPASS_BROKER_TOKEN_FILE) is set without --broker-url: it is not sent to " + projURL, "pass --broker-url with it"}},
		{"nor a token file's", sub, []string{"GPUPASS_BROKER_TOKEN_FILE=" + filepath.Join(home, "tok2")}, nil,
			[]string{"it is not sent to " + projURL, "leave out --broker-token and run: unset GPUPASS_BROKER_TOKEN GPUPASS_BROKER_TOKEN_FILE"}},
		{"nor to the current context's", other, nil, []string{"--broker-token", "gpp_flag"},
			[]string{"it is not sent to " + curURL + ", the broker of the current context cur"}},
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

// Issue #32 item 3, as a newcomer meets it: init, up, then broker
// commands from a subdirectory of the project (they said "no broker"),
// the stack listed as the current context, and a second broker added
// as a context and switched to with the command gpupass prints.
func TestE2EUpContextFromSubdirectory(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := upstack.BuildAll(t)
	home := t.TempDir()
	cfgFile := filepath.Join(home, "cfg", "gpupass", "config.yaml")
	environ := []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, "cfg")}
	proj := filepath.Join(home, "proj")
	initCmd := exec.Command(filepath.Join(bin, "gpupass"), "init", proj)
	initCmd.Env = environ
	if out, err := initCmd.CombinedOutput(); err != nil {
		t.Fatalf("gpupass init: %v\n%s", err, out)
	}
	stack := upstack.Start(t, upstack.Options{Dir: proj, Environ: environ, DefaultStateDir: true})
	stackURL := stack.Config(t).BrokerURL
	if want := "context proj  (current; saved in " + cfgFile + ")"; !strings.Contains(stack.Out.String(), want) {
		t.Errorf("up's lines lack %q:\n%s", want, stack.Out.String())
	}
	sub := filepath.Join(proj, "src", "deep")
	outside := filepath.Join(home, "elsewhere")
	for _, d := range []string{sub, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	gp := func(t *testing.T, dir string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "gpupass"), args...)
		cmd.Dir, cmd.Env = dir, environ
		stdout, stderr, code := testutil.Run(t, cmd)
		if code != 0 {
			t.Fatalf("gpupass %s in %s: exit %d\n%s%s", strings.Join(args, " "), dir, code, stdout, stderr)
		}
		return stdout
	}

	// From a subdirectory, no flags: the project's stack.
	gp(t, sub, "runs")
	if out := gp(t, sub, "nodes"); !strings.Contains(out, "us-west-2") || !strings.Contains(out, "eu-central-1") {
		t.Errorf("nodes from %s lacks the stack's agents:\n%s", sub, out)
	}
	// Outside the project: the current context, which up registered.
	ls := gp(t, outside, "context", "ls")
	if !regexp.MustCompile(`(?m)^\*\s+proj\s+` + regexp.QuoteMeta(stackURL) + `\s`).MatchString(ls) {
		t.Errorf("context ls does not list the stack as current:\n%s", ls)
	}
	if out := gp(t, outside, "nodes"); !strings.Contains(out, "us-west-2") {
		t.Errorf("nodes outside the project, through the current context:\n%s", out)
	}

	// A second broker, with a run only it has.
	other := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	submitter, err := client.DialRuns(other.URL, client.Options{Token: other.Token(t, store.RoleSubmit, "*")})
	if err != nil {
		t.Fatal(err)
	}
	specYAML, err := os.ReadFile(filepath.Join("..", "..", "..", "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sub2, err := submitter.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
		SpecYaml: specYAML, Region: "ap-south-1", Command: []string{"true"}}))
	if err != nil {
		t.Fatal(err)
	}
	otherRun := sub2.Msg.Run.Id
	tokFile := filepath.Join(home, "other.token")
	if err := os.WriteFile(tokFile, []byte(other.Token(t, store.RoleRead, "*")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := gp(t, outside, "context", "add", "other", "--broker-url", other.URL, "--token-file", tokFile)
	_, use, ok := strings.Cut(strings.TrimSpace(out), "use it with: ")
	if !ok {
		t.Fatalf("context add printed no command to switch:\n%s", out)
	}
	pasted := exec.CommandContext(ctx, "bash", "-c", use)
	pasted.Dir, pasted.Env = outside, environ
	if stdout, stderr, code := testutil.Run(t, pasted); code != 0 {
		t.Fatalf("%s, as pasted: exit %d\n%s%s", use, code, stdout, stderr)
	}
	if ls := gp(t, outside, "context", "ls"); !regexp.MustCompile(`(?m)^\*\s+other\s`).MatchString(ls) {
		t.Errorf("after %s, context ls:\n%s", use, ls)
	}
	b, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := os.ReadFile(tokFile); strings.Contains(string(b), strings.TrimSpace(string(tok))) {
		t.Errorf("%s holds the token itself:\n%s", cfgFile, b)
	}
	if out := gp(t, outside, "runs"); !strings.Contains(out, otherRun) {
		t.Errorf("runs outside the project after `context use other` lacks %s:\n%s", otherRun, out)
	}
	// In the project, its stack still comes first; --context picks.
	if out := gp(t, sub, "runs"); strings.Contains(out, otherRun) {
		t.Errorf("runs in the project went to the current context, not the project's stack:\n%s", out)
	}
	if out := gp(t, sub, "--context", "other", "runs"); !strings.Contains(out, otherRun) {
		t.Errorf("--context other in the project lacks %s:\n%s", otherRun, out)
	}
}

// The context commands on the built binary: what each prints, what each
// refuses and how it says the fix, and the file they leave.
func TestE2EContextCommands(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	home := t.TempDir()
	cfgDir := filepath.Join(home, "cfg", "gpupass")
	tok := filepath.Join(home, "a.token")
	if err := os.WriteFile(tok, []byte("gpp_secret_a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gp := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir, cmd.Env = home, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, "cfg")}
		stdout, stderr, code := testutil.Run(t, cmd)
		return stdout + stderr, code
	}
	steps := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"context", "ls"}, 0, "no contexts in " + filepath.Join(cfgDir, "config.yaml")},
		{[]string{"context", "set", "a", "--broker-url", "http://127.0.0.1:1", "--token-file", filepath.Join(home, "missing")}, ExitUsage,
			`--token-file: context "a": token file ` + filepath.Join(home, "missing") + ": no such file or directory"},
		{[]string{"context", "set", "a", "--broker-url", "http://127.0.0.1:1"}, ExitUsage,
			"gpupass context set a --broker-url http://127.0.0.1:1 --token-file FILE"},
		{[]string{"context", "set", "bad/name", "--broker-url", "http://127.0.0.1:1", "--token-file", tok}, ExitUsage, `context name "bad/name"`},
		{[]string{"context", "set", "a", "--broker-url", "http://127.0.0.1:1", "--token-file", "a.token"}, 0, "(current: it is the first)"},
		{[]string{"context", "add", "b", "--broker-url", "http://127.0.0.1:2", "--token-file", tok}, 0, "use it with: gpupass context use b"},
		{[]string{"context", "use", "c"}, ExitUsage, `no context "c" in ` + filepath.Join(cfgDir, "config.yaml") + " (there are: a, b)"},
		{[]string{"context", "use", "b"}, 0, "current context: b"},
		{[]string{"context", "rm", "b"}, 0, "context b removed"},
		{[]string{"context", "ls"}, 0, "http://127.0.0.1:1  " + tok},
	}
	for _, s := range steps {
		out, code := gp(s.args...)
		if code != s.code || !strings.Contains(out, s.want) {
			t.Errorf("gpupass %s: exit %d (want %d), output lacks %q:\n%s", strings.Join(s.args, " "), code, s.code, s.want, out)
		}
		if strings.Contains(out, "gpp_secret") {
			t.Errorf("gpupass %s printed the token:\n%s", strings.Join(s.args, " "), out)
		}
	}
	// b was current: after rm no context is.
	if out, _ := gp("context", "ls"); strings.Contains(out, "*") {
		t.Errorf("a removed current context is still current:\n%s", out)
	}
	for p, want := range map[string]os.FileMode{cfgDir: 0o700, filepath.Join(cfgDir, "config.yaml"): 0o600} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %v", p, st.Mode(), err, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(cfgDir, "config.yaml")); strings.Contains(string(b), "gpp_secret") {
		t.Errorf("config.yaml holds the token:\n%s", b)
	}
}
