//go:build e2e

package gpupass_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// gp runs the built gpupass with the stack's environment from its root
// and returns stdout, stderr and the exit code.
func gp(t *testing.T, ctx context.Context, s *upstack.Stack, args ...string) (string, string, int) {
	t.Helper()
	return testutil.Run(t, s.Command(ctx, args...))
}

// Issue #32, items 5 and 10, on the built binaries against `up`: a
// comma-separated --region is one run per region; a bad region name is
// refused by train and up; train without --follow says how to follow
// each run, and the commands it prints work pasted; a running run counts
// its attempt; a cancelled run's log and the CLI say "cancelled" once; a
// shipped checkpoint's line says "checkpoint" once, and a run without
// --resume-elsewhere ships none; train --follow whose runs ended at
// submission prints its table once.
func TestE2ETrainFirstHour(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	// The binaries on PATH, as for a user who pastes what gpupass prints.
	stack := upstack.Start(t, upstack.Options{Env: []string{"PATH=" + upstack.BuildAll(t) + ":" + os.Getenv("PATH")}})
	spec := []string{"train", "--spec", "examples/train/gpupass.yaml"}

	// One flag, two regions, no --follow; --resume-elsewhere, so the
	// checkpoint is shipped to the broker.
	job := `echo x > "$GPUPASS_CHECKPOINT_DIR/ckpt-1.pt"; sleep 90`
	stdout, stderr, code := gp(t, ctx, stack, append(spec, "--region", "us-west-2,eu-central-1", "--name", "hour", "--resume-elsewhere", "--", "sh", "-c", job)...)
	if code != 0 {
		t.Errorf("train --region us-west-2,eu-central-1: exit %d\n%s%s", code, stdout, stderr)
	}
	type runJSON struct {
		ID, Name, Region, State, Reason string
		Attempts                        int
	}
	runs := func() []runJSON {
		out, errOut, code := gp(t, ctx, stack, "runs", "-o", "json")
		if code != 0 {
			t.Fatalf("runs -o json: exit %d\n%s", code, errOut)
		}
		var v struct{ Runs []runJSON }
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("runs -o json: %v\n%s", err, out)
		}
		return v.Runs
	}
	for _, r := range runs() {
		if strings.Contains(r.Region, ",") {
			t.Errorf("run %s is in region %q", r.ID, r.Region)
		}
	}

	ids := map[string]string{}
	for _, r := range runs() {
		if r.Name == "hour-"+r.Region {
			ids[r.Region] = r.ID
		}
	}
	if ids["us-west-2"] == "" || ids["eu-central-1"] == "" {
		t.Fatalf("train --region us-west-2,eu-central-1: want a run in each region, got %v", runs())
	}
	// Each run's hint, as pasted; the checks below go on without one.
	hints := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^follow (\S+) with: (gpupass logs --follow (alloc-\S+))$`).FindAllStringSubmatch(stderr, -1) {
		hints[m[1]] = m[2]
	}
	for region, id := range ids {
		if hints[region] != "gpupass logs --follow "+id {
			t.Errorf("train without --follow: want `follow %s with: gpupass logs --follow %s` on stderr, got %v\nstdout:\n%s\nstderr:\n%s", region, id, hints, stdout, stderr)
			hints[region] = "gpupass logs --follow " + id
		}
	}

	// Running, each run says attempt 1, as its log does.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var seen []string
		ok := 0
		for _, r := range runs() {
			if r.ID == ids["us-west-2"] || r.ID == ids["eu-central-1"] {
				seen = append(seen, fmt.Sprintf("%s %s attempts %d", r.ID, r.State, r.Attempts))
				if r.State == "running" && r.Attempts == 1 {
					ok++
				}
			}
		}
		if ok == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("want both runs running with attempts 1 within 60s; runs -o json says: %s", strings.Join(seen, "; "))
			break
		}
		time.Sleep(500 * time.Millisecond)
	}

	// The checkpoint the job wrote is shipped; its line names it once.
	id := ids["us-west-2"]
	wait, stopWait := context.WithTimeout(ctx, 60*time.Second)
	var logs string
	upstack.WaitFor(t, wait, "the checkpoint's line in the log of "+id, func() bool {
		logs, _, _ = gp(t, ctx, stack, "logs", id)
		return strings.Contains(logs, "shipped for resuming elsewhere")
	})
	stopWait()
	if !strings.Contains(logs, "INFO checkpoint ckpt-1.pt (") {
		t.Errorf("the shipped checkpoint's line does not read `checkpoint ckpt-1.pt (`:\n%s", logs)
	}

	// Cancel as the user does, then paste the hint: it follows the run to
	// its end and says cancelled once.
	for _, region := range []string{"us-west-2", "eu-central-1"} {
		out, errOut, code := gp(t, ctx, stack, "cancel", ids[region])
		if code != 0 {
			t.Fatalf("cancel %s: exit %d\n%s%s", ids[region], code, out, errOut)
		}
	}
	out, code := shell(t, ctx, stack, stack.Root, hints["us-west-2"])
	if code != 1 || !strings.Contains(out, "run "+id+" cancelled by") {
		t.Errorf("pasted %q: exit %d, want 1 and `run %s cancelled by`:\n%s", hints["us-west-2"], code, id, upstack.Tail(out, 3000))
	}
	if strings.Contains(out, "cancelled: cancelled") {
		t.Errorf("the log of a cancelled run stutters:\n%s", upstack.Tail(out, 3000))
	}

	// Without --resume-elsewhere no other node resumes from the run's
	// checkpoints: they stay on the node, none reaches the broker.
	kept := `echo x > "$GPUPASS_CHECKPOINT_DIR/ckpt-1.pt"; sleep 3; echo wrote ckpt-1.pt`
	stdout, stderr, code = gp(t, ctx, stack, append(spec, "--region", "us-west-2", "--follow", "--", "sh", "-c", kept)...)
	if code != 0 || !strings.Contains(stdout+stderr, "wrote ckpt-1.pt") {
		t.Errorf("train without --resume-elsewhere: exit %d\n%s%s", code, stdout, stderr)
	}
	if strings.Contains(stdout+stderr, "shipped for resuming elsewhere") {
		t.Errorf("a run without --resume-elsewhere shipped its checkpoint to the broker:\n%s", upstack.Tail(stdout+stderr, 3000))
	}

	// A region no node is in: the run ends at submission, and --follow
	// prints its table once.
	stdout, stderr, code = gp(t, ctx, stack, append(spec, "--region", "mars-1", "--follow", "--", "true")...)
	if n := strings.Count(stdout, "ALLOC "); code != 1 || n != 1 {
		t.Errorf("train --follow in mars-1: exit %d, %d tables, want exit 1 and one table\n%s%s", code, n, stdout, stderr)
	}

	// Bad region names: refused before anything runs, naming the flag.
	_, stderr, code = gp(t, ctx, stack, append(spec, "--region", "US-West-2", "--", "true")...)
	if code != 2 || !strings.Contains(stderr, `--region "US-West-2": not a region name: use lowercase letters`) {
		t.Errorf("train --region US-West-2: exit %d, want 2 naming --region and the rule\n%s", code, stderr)
	}
	upCtx, stopUp := context.WithTimeout(ctx, 30*time.Second)
	defer stopUp()
	upCmd := exec.CommandContext(upCtx, stack.Bin+"/gpupass", "up", "--state-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--region", "us west")
	upCmd.Env = stack.Env
	_, stderr, code = testutil.Run(t, upCmd)
	if code != 2 || !strings.Contains(stderr, `--region "us west": not a region name`) {
		t.Errorf("up --region 'us west': exit %d, want 2 naming --region\n%s", code, stderr)
	}
}
