//go:build e2e

package gpupass_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// cleanProject is a project directory, a clean HOME and the binaries
// first on PATH: up keeps its state in proj/.gpupass, as for a user.
func cleanProject(t *testing.T) (proj string, environ []string) {
	t.Helper()
	bin := upstack.BuildAll(t)
	proj = filepath.Join(t.TempDir(), "proj")
	if err := os.MkdirAll(proj, 0o755); err != nil {
		t.Fatal(err)
	}
	return proj, []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
}

// Issue #32, item 4: a second `up` on the state dir of a running one is
// refused at once, naming the running stack, and leaves its config.json
// alone; the commands the refusal prints work as pasted: the second
// stack it suggests comes up, and `kill PID` stops the first, after
// which the state dir is free again.
func TestE2EUpSecondOnSameStateDirRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	proj, environ := cleanProject(t)
	opts := upstack.Options{Dir: proj, Environ: environ, DefaultStateDir: true, Regions: []string{"us-west-2"}}
	stack := upstack.Start(t, opts)
	cfgPath := filepath.Join(stack.State, "config.json")
	before, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	url := stack.Config(t).BrokerURL

	// The second up, as a user runs it in the same project.
	second, cancel2 := context.WithTimeout(ctx, 60*time.Second)
	out, code := shell(t, second, stack, proj, "gpupass up --listen 127.0.0.1:0 --region us-west-2")
	cancel2()
	pid := strconv.Itoa(stack.PID())
	want := "a stack is already running here (pid " + pid + ", URL " + url
	if code != 2 || !strings.Contains(out, want) || !strings.Contains(out, "`kill "+pid+"`") {
		t.Fatalf("second up on the same state dir: exit %d, want 2 and %q naming `kill %s`:\n%s", code, want, pid, upstack.Tail(out, 3000))
	}
	if after, _ := os.ReadFile(cfgPath); !bytes.Equal(after, before) {
		t.Errorf("the refused up changed config.json:\n%s\nwas:\n%s", after, before)
	}
	rc, err := client.DialRuns(url, client.Options{Token: stack.Config(t).Token})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{})); err != nil {
		t.Errorf("the first stack's broker after the refusal: %v", err)
	}

	// Paste the suggested second stack: it comes up beside the first.
	cmds := regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(out, -1)
	var other, kill string
	for _, m := range cmds {
		switch {
		case strings.HasPrefix(m[1], "gpupass up "):
			other = m[1]
		case strings.HasPrefix(m[1], "kill "):
			kill = m[1]
		}
	}
	if other == "" || kill == "" {
		t.Fatalf("the refusal prints no `gpupass up …` or `kill …` to paste:\n%s", out)
	}
	var otherOut upstack.Buffer
	oc := exec.CommandContext(ctx, "bash", "-c", "exec "+other+" --region us-west-2")
	oc.Dir, oc.Env, oc.Stdout, oc.Stderr = proj, stack.Env, &otherOut, &otherOut
	if err := oc.Start(); err != nil {
		t.Fatal(err)
	}
	otherDone := make(chan error, 1)
	go func() { otherDone <- oc.Wait() }()
	upstack.WaitFor(t, ctx, "the pasted `"+other+"` to come up", func() bool {
		select {
		case err := <-otherDone:
			t.Fatalf("%s exited before it came up: %v\n%s", other, err, upstack.Tail(otherOut.String(), 3000))
		default:
		}
		return strings.Contains(otherOut.String(), "Ctrl-C stops everything")
	})
	_ = oc.Process.Signal(syscall.SIGINT)
	if err := <-otherDone; err != nil {
		t.Errorf("%s: %v\n%s", other, err, upstack.Tail(otherOut.String(), 3000))
	}

	// Paste the kill: the first up stops, and a new one takes the dir.
	if out, code := shell(t, ctx, stack, proj, kill); code != 0 {
		t.Fatalf("%s: exit %d\n%s", kill, code, out)
	}
	upstack.WaitFor(t, ctx, "up to exit after `"+kill+"`", func() bool { return syscall.Kill(stack.PID(), 0) != nil })
	if err := stack.Stop(); err != nil {
		t.Errorf("up after `%s`: %v, want a clean stop", kill, err)
	}
	again := upstack.Start(t, opts)
	if got := again.Config(t).BrokerURL; got == url {
		t.Errorf("the new up's config still names the old broker %s", url)
	}
}
