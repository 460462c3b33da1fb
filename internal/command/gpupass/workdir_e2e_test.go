//go:build e2e

package gpupass_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// newProject is a newcomer's first minutes: a clean HOME, `gpupass init
// proj`, and `gpupass up` run in proj with nothing of this machine's
// environment but PATH (the binaries first), so up keeps its state in
// proj/.gpupass as it does for a user.
func newProject(t *testing.T) (*upstack.Stack, string) {
	t.Helper()
	return newProjectIn(t, "")
}

// newProjectIn is newProject with up run in proj's subdirectory sub
// (created; "" for proj itself).
func newProjectIn(t *testing.T, sub string) (*upstack.Stack, string) {
	t.Helper()
	upstack.RequireTorch(t)
	bin := upstack.BuildAll(t)
	home := t.TempDir()
	proj := filepath.Join(t.TempDir(), "proj")
	environ := []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + home}
	initCmd := exec.Command(filepath.Join(bin, "gpupass"), "init", proj)
	initCmd.Env = environ
	if out, err := initCmd.CombinedOutput(); err != nil {
		t.Fatalf("gpupass init: %v\n%s", err, out)
	}
	dir := filepath.Join(proj, sub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return upstack.Start(t, upstack.Options{Dir: dir, Environ: environ, DefaultStateDir: true}), proj
}

// shell runs script with bash -c in dir with the stack's environment, as
// a user pastes it into a terminal there.
func shell(t *testing.T, ctx context.Context, s *upstack.Stack, dir, script string) (string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir, cmd.Env = dir, s.Env
	stdout, stderr, code := testutil.Run(t, cmd)
	return stdout + stderr, code
}

// Issue #32, item 1: every command `up` prints for the next step (the
// ready line, and the export line where the state dir is not the
// default) runs as printed, pasted from the project dir, and the runs
// it starts succeed: the spec's directory, with train.py, is the work dir.
func TestE2EUpPrintedCommandsRunAsPasted(t *testing.T) {
	t.Parallel()
	upPastedIn(t, "")
}

// The same from a subdirectory of the project: up there keeps its state
// in the project's .gpupass, beside its spec (it made a second stack in
// the subdirectory and printed `gpupass init &&`, which wrote a second
// project there), and its lines run as pasted in the subdirectory.
func TestE2EUpPrintedCommandsRunAsPastedFromSubdirectory(t *testing.T) {
	t.Parallel()
	sub := filepath.Join("src", "deep")
	stack, proj := upPastedIn(t, sub)
	if got, want := stack.Config(t).StateDir, filepath.Join(proj, ".gpupass"); got != want {
		t.Errorf("up in %s keeps its state in %s, want the project's %s", sub, got, want)
	}
	if _, err := os.Stat(filepath.Join(proj, sub, "gpupass.yaml")); err == nil {
		t.Errorf("the pasted lines wrote a second spec in %s", sub)
	}
}

// upPastedIn starts up in proj's subdirectory sub after `gpupass init
// proj` and pastes its ready and export lines there; the runs succeed.
func upPastedIn(t *testing.T, sub string) (*upstack.Stack, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack, proj := newProjectIn(t, sub)
	var script []string
	for _, l := range strings.Split(stack.Out.String(), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "ready: "):
			script = append(script, strings.TrimPrefix(l, "ready: "))
		case strings.HasPrefix(l, "other shells: "):
			script = append(script, strings.TrimPrefix(l, "other shells: "))
		}
	}
	if len(script) == 0 || !strings.Contains(strings.Join(script, "\n"), "gpupass train") {
		t.Fatalf("up printed no train command:\n%s", stack.Out.String())
	}
	out, code := shell(t, ctx, stack, filepath.Join(proj, sub), "set -e\n"+strings.Join(script, "\n"))
	if code != 0 {
		t.Fatalf("the commands up printed:\n%s\nexit %d:\n%s", strings.Join(script, "\n"), code, upstack.Tail(out, 4000))
	}
	for _, want := range []string{"us-west-2", "eu-central-1", "trainer done", "succeeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("the pasted commands' output lacks %q:\n%s", want, upstack.Tail(out, 4000))
		}
	}
	if strings.Contains(out, "can't open file") {
		t.Errorf("train.py did not reach the nodes:\n%s", upstack.Tail(out, 4000))
	}
	return stack, proj
}

// nodeFiles pastes `gpupass train --workdir . … EXTRA -- find .` into a
// shell in proj and returns what the node's unpacked work dir held (the
// job prints it into its log), with train's output and exit code.
func nodeFiles(t *testing.T, ctx context.Context, s *upstack.Stack, proj, extra string) (map[string]bool, string, int) {
	t.Helper()
	out, code := shell(t, ctx, s, proj, "gpupass train --workdir . --region us-west-2 --follow "+extra+" -- find . -mindepth 1")
	files := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if _, f, ok := strings.Cut(l, " stdout ./"); ok {
			files[f] = true
		}
	}
	return files, out, code
}

// Issue #31, finding 6, as a user meets it: after `init` and `up`, with
// a signing key and an .env next to the code, `train --workdir .` is
// refused naming both, with fixes that work as printed; the node's work
// dir never holds up's state dir (database, config.json with the token),
// nor what .gitignore ignores, nor a secret not asked for.
func TestE2ETrainWorkdirKeepsStateAndSecretsHome(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack, proj := newProject(t)
	token := stack.Config(t).Token
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(proj, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("cosign.key", "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nx\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
	write(".env", "WANDB_API_KEY=x\n")
	write("model.ckpt", "weights")
	if b, err := os.ReadFile(filepath.Join(proj, ".gitignore")); err != nil || !strings.Contains(string(b), ".gpupass/\n") {
		t.Errorf("init wrote no .gitignore that keeps .gpupass/ out of git (%v): %q", err, b)
	}
	f, err := os.OpenFile(filepath.Join(proj, ".gitignore"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("*.ckpt\n")
	f.Close()

	_, out, code := nodeFiles(t, ctx, stack, proj, "")
	if code != 2 {
		t.Fatalf("train --workdir . with cosign.key and .env: exit %d, want 2 (refused):\n%s", code, upstack.Tail(out, 3000))
	}
	for _, want := range []string{"cosign.key", ".env", "look like secrets", "--include", ".gpupassignore"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, token) {
		t.Errorf("the refusal prints the submit token")
	}
	var printf, include string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "printf ") {
			printf = strings.TrimSpace(l)
		}
		if _, rest, ok := strings.Cut(l, "or ship them on purpose: add "); ok {
			include = strings.TrimSuffix(rest, " to the command")
		}
	}
	if printf == "" || include == "" {
		t.Fatalf("the refusal prints no fix to paste:\n%s", out)
	}

	// Shipped on purpose, as the refusal says: the key and .env arrive,
	// the state dir and the ignored checkpoint do not.
	files, out, code := nodeFiles(t, ctx, stack, proj, include)
	if code != 0 {
		t.Fatalf("train with %s: exit %d:\n%s", include, code, upstack.Tail(out, 3000))
	}
	check := func(files map[string]bool, want, notWant []string) {
		t.Helper()
		for _, f := range want {
			if !files[f] {
				t.Errorf("the node's work dir lacks %s: %v", f, files)
			}
		}
		for f := range files {
			for _, bad := range notWant {
				if f == bad || strings.HasPrefix(f, bad+"/") {
					t.Errorf("the node's work dir holds %s", f)
				}
			}
		}
	}
	check(files, []string{"train.py", "gpupass.yaml", ".gitignore", "cosign.key", ".env"}, []string{".gpupass", "model.ckpt"})
	if !strings.Contains(out, "work dir . shipped: 6 files") {
		t.Errorf("train does not sum up what it shipped:\n%s", upstack.Tail(out, 3000))
	}

	// Left out, as the refusal's other fix says (pasted through a shell).
	if out, code := shell(t, ctx, stack, proj, printf); code != 0 {
		t.Fatalf("%s: exit %d\n%s", printf, code, out)
	}
	files, out, code = nodeFiles(t, ctx, stack, proj, "")
	if code != 0 {
		t.Fatalf("train after %s: exit %d:\n%s", printf, code, upstack.Tail(out, 3000))
	}
	check(files, []string{"train.py", "gpupass.yaml", ".gpupassignore"}, []string{".gpupass", "model.ckpt", "cosign.key", ".env"})
	list, _, code := testutil.Run(t, func() *exec.Cmd {
		c := stack.Command(ctx, "train", "--workdir", ".", "--list-workdir")
		c.Dir = proj
		return c
	}())
	for _, want := range []string{"skip  .gpupass/  (always", "skip  model.ckpt  (.gitignore:", "skip  cosign.key  (.gpupassignore:", "ship  train.py"} {
		if code != 0 || !strings.Contains(list, want) {
			t.Errorf("--list-workdir (exit %d) lacks %q:\n%s", code, want, list)
		}
	}
}

// Issue #32, item 2: the spec `init` writes is one every node of `up`'s
// default stack (its profile, in each of its regions) can run: dry-run
// from the project dir lists every agent as a candidate and excludes
// none, so the first `train` is placed.
func TestE2EInitSpecMatchesEveryUpNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stack, proj := newProject(t)
	agents := len(stack.Config(t).Regions)
	var out string
	var dry struct {
		DryRun struct {
			Candidates []struct{ Region string }
			Excluded   []struct {
				Node    struct{ ID string }
				Reasons []struct{ Message string }
			}
		} `json:"dry_run"`
	}
	upstack.WaitFor(t, ctx, "every agent of up certified", func() bool {
		var code int
		out, code = shell(t, ctx, stack, proj, "gpupass validate --dry-run --all -o json 2>/dev/null")
		dry.DryRun.Candidates, dry.DryRun.Excluded = nil, nil
		if err := json.Unmarshal([]byte(out), &dry); err != nil {
			t.Fatalf("validate --dry-run -o json (exit %d): %v\n%s", code, err, out)
		}
		for _, x := range dry.DryRun.Excluded {
			for _, r := range x.Reasons {
				if !strings.Contains(r.Message, "no verified conformance report") {
					t.Fatalf("init's spec excludes %s of up's stack: %s\n%s", x.Node.ID, r.Message, out)
				}
			}
		}
		return len(dry.DryRun.Candidates) == agents && len(dry.DryRun.Excluded) == 0
	})
	regions := map[string]bool{}
	for _, c := range dry.DryRun.Candidates {
		regions[c.Region] = true
	}
	if len(regions) != agents || agents < 2 {
		t.Errorf("candidates in %d region(s) of %d agents, want every region up started:\n%s", len(regions), agents, out)
	}
}

// From a subdirectory of a project, train and validate without --spec
// name the project's spec instead of `gpupass init` (which would write a
// second project there), and the fix they print works as pasted.
func TestE2ESpecFromSubdirectory(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	home := t.TempDir()
	proj := filepath.Join(t.TempDir(), "proj")
	sub := filepath.Join(proj, "src", "deep")
	gp := func(dir string, args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir, cmd.Env = dir, []string{"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, "cfg"), "PATH=" + os.Getenv("PATH")}
		stdout, stderr, code := testutil.Run(t, cmd)
		return stdout + stderr, code
	}
	if out, code := gp(filepath.Dir(proj), "init", proj); code != 0 {
		t.Fatalf("gpupass init: exit %d\n%s", code, out)
	}
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// No broker here: the pasted train gets past its spec to the broker.
	for _, args := range [][]string{{"train", "--region", "us-west-2", "--", "true"}, {"validate"}} {
		out, code := gp(sub, args...)
		_, fix, ok := strings.Cut(strings.TrimSpace(out), "the project's spec is ../../gpupass.yaml: pass ")
		if code != 2 || !ok || strings.Contains(out, "gpupass init") {
			t.Errorf("gpupass %s in a subdirectory: exit %d, want 2 naming the project's spec and no init:\n%s", strings.Join(args, " "), code, out)
			continue
		}
		pasted := append(append([]string{args[0]}, strings.Fields(fix)...), args[1:]...)
		out, code = gp(sub, pasted...)
		if args[0] == "train" && code == 2 && strings.Contains(out, "no broker") && !strings.Contains(out, "spec") {
			continue
		}
		if code != 0 {
			t.Errorf("gpupass %s, the fix pasted: exit %d\n%s", strings.Join(pasted, " "), code, out)
		}
	}
}
