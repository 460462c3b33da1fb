//go:build e2e

package gpupass_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// Issue #35, "gpupass wait killed and started again mid-run exits with
// the right code once the runs end", on the built binaries against
// `gpupass up`: train --detach exits while its runs go on and prints the
// wait command; that command, pasted, is killed (SIGKILL, by pid) while
// the runs still run, which leaves them running; started again it
// follows them to the end and exits 0 for a group that succeeded and 1
// (train --follow's code) for one with a failed run. --timeout exits 3.
func TestE2EWaitKilledAndResumed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	// The binaries on PATH, as for a user who pastes what gpupass prints.
	stack := upstack.Start(t, upstack.Options{Env: []string{"PATH=" + upstack.BuildAll(t) + ":" + os.Getenv("PATH")}})

	// 25 s of steps; the run in eu-central-1 then fails.
	job := `i=1; while [ $i -le 25 ]; do echo "step $i loss 0.$((100-i))"; i=$((i+1)); sleep 1; done; [ "$GPUPASS_REGION" != eu-central-1 ]`
	detach := func(name string, regions string) (group, waitCmd string) {
		t.Helper()
		stdout, stderr, code := gp(t, ctx, stack, "train", "--detach", "--spec", "examples/train/gpupass.yaml", "--region", regions, "--name", name, "--", "sh", "-c", job)
		m := regexp.MustCompile(`(?m)with: (gpupass wait (group-[0-9a-f]{16}))$`).FindStringSubmatch(stderr)
		if code != 0 || m == nil || !strings.Contains(stdout, "run group "+m[2]) {
			t.Fatalf("train --detach --region %s: exit %d, want 0 with the group and the wait command\nstdout:\n%s\nstderr:\n%s", regions, code, stdout, stderr)
		}
		return m[2], m[1]
	}
	okGroup, okWait := detach("waitok", "us-west-2")
	badGroup, badWait := detach("waitbad", "us-west-2,eu-central-1")

	states := func(group string) map[string]string {
		out, errOut, code := gp(t, ctx, stack, "runs", "--group", group, "-o", "json")
		if code != 0 {
			t.Fatalf("runs --group %s: exit %d\n%s", group, code, errOut)
		}
		var v struct {
			Runs []struct{ Region, State string }
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("runs -o json: %v\n%s", err, out)
		}
		m := map[string]string{}
		for _, r := range v.Runs {
			m[r.Region] = r.State
		}
		return m
	}

	t.Run("timeout", func(t *testing.T) {
		stdout, stderr, code := gp(t, ctx, stack, "wait", "--timeout", "2s", okGroup)
		if code != gpupass.ExitTimeout || !strings.Contains(stderr, "still going") || !strings.Contains(stderr, "wait again with: "+okWait) {
			t.Errorf("wait --timeout 2s: exit %d, want %d, the runs still going and %q\nstdout:\n%s\nstderr:\n%s", code, gpupass.ExitTimeout, okWait, stdout, stderr)
		}
	})

	for _, tt := range []struct {
		name, group, wait string
		wantCode          int
		want              []string
	}{
		{"a group that succeeds: exit 0", okGroup, okWait, 0, []string{"us-west-2"}},
		{"a group with a failed run: exit 1", badGroup, badWait, gpupass.ExitFindings, []string{"us-west-2", "eu-central-1", "1 of 2 runs did not succeed"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The command as printed, pasted: its words, no shell.
			words := strings.Fields(tt.wait)
			first := stack.Command(ctx, words[1:]...)
			out := &testutil.Buffer{}
			first.Stdout, first.Stderr = out, out
			if err := first.Start(); err != nil {
				t.Fatal(err)
			}
			// Killed once it follows a run's log.
			upstack.WaitFor(t, ctx, "wait to print a step", func() bool { return strings.Contains(out.String(), "loss 0.9") })
			if err := syscall.Kill(first.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill -9 wait %d: %v", first.Process.Pid, err)
			}
			_ = first.Wait()
			// Killed mid-run: a run of the group still goes on.
			if got := states(tt.group); !slices.ContainsFunc(slices.Collect(maps.Values(got)), func(st string) bool { return !ended(st) }) {
				t.Fatalf("every run had ended when wait was killed (%v): the kill came too late to test a resume", got)
			}
			stdout, stderr, code := gp(t, ctx, stack, words[1:]...)
			all := stdout + stderr
			if code != tt.wantCode {
				t.Fatalf("%s started again: exit %d, want %d\n%s", tt.wait, code, tt.wantCode, all)
			}
			for _, w := range append(tt.want, "step 25 loss") {
				if !strings.Contains(all, w) {
					t.Errorf("%s started again says no %q:\n%s", tt.wait, w, all)
				}
			}
			for region, st := range states(tt.group) {
				if !ended(st) {
					t.Errorf("wait exited with the run in %s %s", region, st)
				}
			}
		})
	}
}

// ended says whether a run state, as runs -o json prints it, is final.
func ended(state string) bool {
	return runview.Terminal(gpupassv1.AllocState(gpupassv1.AllocState_value["ALLOC_STATE_"+strings.ToUpper(state)]))
}
