package gpupass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/api"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/workdir"
)

// Issue #35: train --detach submits and exits; gpupass wait follows the
// group (or the runs named by id) to the end and exits as train --follow
// would; --timeout ends with its own code and the command to run again,
// which, pasted, waits on.
func TestTrainDetachAndWait(t *testing.T) {
	t.Parallel()
	url, tok := runsBroker(t, true) // eu-central-1 fails; ap-south-1's node never takes work
	spec := writeH100Spec(t)
	broker := []string{"--broker-url", url, "--broker-token", tok}
	// detach fails t, the subtest's: the parent's t must not be failed
	// from a subtest.
	detach := func(t *testing.T, broker []string, regions ...string) (ids []string, group string) {
		t.Helper()
		args := []string{"train", "--detach", "--spec", spec, "--min-health-score", "0", "--region", strings.Join(regions, ",")}
		code, out, errOut := runMain(t, append(append(args, broker...), "--", "true")...)
		group = groupRE.FindString(out)
		if code != 0 || group == "" || !strings.Contains(errOut, "gpupass wait ") || strings.Contains(out, "step 5 in") {
			t.Fatalf("train --detach: exit %d, group %q, want 0, a group, the wait command and no log\nstdout:\n%s\nstderr:\n%s", code, group, out, errOut)
		}
		return allocRE.FindAllString(out, -1), group
	}

	t.Run("detach with follow is a usage error naming both", func(t *testing.T) {
		t.Parallel()
		code, _, errOut := runMain(t, append([]string{"train", "--detach", "--follow", "--spec", spec, "--region", "us-west-2"}, append(broker, "--", "true")...)...)
		if code != gpupass.ExitUsage || !strings.Contains(errOut, "--detach and --follow") {
			t.Errorf("exit %d, want %d naming --detach and --follow:\n%s", code, gpupass.ExitUsage, errOut)
		}
	})

	t.Run("a group with a failed run: exit 1 as train --follow", func(t *testing.T) {
		t.Parallel()
		ids, group := detach(t, broker, "us-west-2", "eu-central-1")
		code, out, errOut := runMain(t, append([]string{"wait", group}, broker...)...)
		if code != gpupass.ExitFindings || !strings.Contains(errOut, "1 of 2 runs did not succeed") {
			t.Fatalf("wait %s: exit %d, want %d and the failed run named\nstdout:\n%s\nstderr:\n%s", group, code, gpupass.ExitFindings, out, errOut)
		}
		// The runs as ended (a run still going when wait started has
		// its log followed; one that had ended, its line in the table).
		for _, want := range []string{"succeeded", "failed", ids[0], ids[1]} {
			if !strings.Contains(out, want) {
				t.Errorf("wait's output lacks %q:\n%s", want, out)
			}
		}
		// Started again once the runs have ended: the same result.
		if again, _, errOut := runMain(t, append([]string{"wait", group}, broker...)...); again != code {
			t.Errorf("wait again: exit %d, want %d\n%s", again, code, errOut)
		}
		// The succeeded run alone, by its allocation id.
		if code, out, errOut := runMain(t, append([]string{"wait", ids[0]}, broker...)...); code != 0 {
			t.Errorf("wait %s: exit %d, want 0\n%s\n%s", ids[0], code, out, errOut)
		}
	})

	t.Run("timeout: its own code and a command that waits on", func(t *testing.T) {
		t.Parallel()
		// A broker of its own: ap-south-1's node never beats, so it is
		// offline a minute after it registered, and on a loaded machine
		// the other subtests can take that long (CI: "last heartbeat
		// 1m14s ago"); the run must stay pending here.
		url, tok := runsBroker(t, true)
		broker := []string{"--broker-url", url, "--broker-token", tok}
		_, group := detach(t, broker, "ap-south-1")
		code, out, errOut := runMain(t, append([]string{"wait", "--timeout", "1s", group}, broker...)...)
		if code != gpupass.ExitTimeout || !strings.Contains(errOut, "still going") || !strings.Contains(out, "ap-south-1") {
			t.Fatalf("wait --timeout 1s: exit %d, want %d saying the runs are still going\nstdout:\n%s\nstderr:\n%s", code, gpupass.ExitTimeout, out, errOut)
		}
		m := regexp.MustCompile(`wait again with: (gpupass wait \S+)`).FindStringSubmatch(errOut)
		if m == nil || m[1] != "gpupass wait "+group {
			t.Fatalf("the command to run again: %v, want gpupass wait %s\n%s", m, group, errOut)
		}
		pasted := append(strings.Fields(m[1])[1:], append([]string{"--timeout", "1s"}, broker...)...)
		if code, _, errOut := runMain(t, pasted...); code != gpupass.ExitTimeout {
			t.Errorf("the pasted command: exit %d, want %d\n%s", code, gpupass.ExitTimeout, errOut)
		}

		// Interrupted (Ctrl-C, a cancelled CI job's SIGTERM): the runs
		// go on, and the message says so and how to wait on.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var sout, serr bytes.Buffer
		code = gpupass.Main(ctx, append([]string{"wait", group}, broker...), strings.NewReader(""), &sout, &serr)
		if code != gpupass.ExitUsage || !strings.Contains(serr.String(), "the runs keep running; wait again with: gpupass wait "+group) {
			t.Errorf("wait interrupted: exit %d, want %d saying the runs keep running and how to wait on\n%s", code, gpupass.ExitUsage, serr.String())
		}
	})

	t.Run("bad arguments", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			args []string
			want string
		}{
			{nil, "missing GROUP or ALLOC"},
			{[]string{"group-xyz"}, "a group id is group- followed by 16 hex digits"},
			{[]string{"group-0000000000000000"}, "no runs in this token's scope"},
			// A pipeline's value after --: an argument, never a flag.
			{[]string{"--", "--broker-url=http://127.0.0.1:1"}, `"--broker-url=http://127.0.0.1:1": neither a run group id`},
			{[]string{"--timeout", "-1s", "group-0000000000000000"}, "--timeout -1s: must not be negative"},
			// In a pipeline's script line: wait is no Action step, so
			// there is no input to name, only the variable.
			{[]string{"-o", "github", "--timeout", "-1s", "group-0000000000000000"}, "--timeout (GPUPASS_TIMEOUT) -1s: must not be negative"},
		} {
			code, _, errOut := runMain(t, append(append([]string{"wait"}, broker...), tt.args...)...)
			if code != gpupass.ExitUsage || !strings.Contains(errOut, tt.want) || strings.Contains(errOut, tok) || strings.Contains(errOut, " input") {
				t.Errorf("wait %v: exit %d, want %d saying %q:\n%s", tt.args, code, gpupass.ExitUsage, tt.want, errOut)
			}
		}
	})
}

// TestCIStepTrainDetachWait runs the train step with the wait input
// false (train with GPUPASS_FOLLOW=false, what the action and the
// component pass) and then gpupass wait as a later step: the group
// reaches the step output (GitHub) and the dotenv file (GitLab), and wait
// hands on the same outputs with train's exit code.
func TestCIStepTrainDetachWait(t *testing.T) {
	t.Parallel()
	url, tok := runsBroker(t, true)
	spec := writeH100Spec(t)
	for _, kind := range []string{"github", "gitlab"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			env := ciEnv(kind, dir)
			getenv := func(k string) string { return env[k] }
			o := &gpupass.TrainOptions{Global: &gpupass.GlobalOptions{Output: output.Format(kind)}, Detach: true, CommandLine: "python3 train.py",
				Broker: gpupass.BrokerFlags{URL: url, Token: tok},
				Options: apptrain.Options{Spec: spec, Regions: []string{"us-west-2, eu-central-1"}, NoWorkdir: true,
					WorkdirLimits: workdir.Default(), Getenv: getenv}}
			var out, log bytes.Buffer
			o.Broker.ErrOut = &log
			if err := gpupass.RunTrain(context.Background(), o, &out, &log); err != nil {
				t.Fatalf("train --detach: %v\n%s\n%s", err, out.String(), log.String())
			}
			group := stepOutput(t, kind, dir, "group")
			if api.CheckGroupID(group) != nil {
				t.Fatalf("group output %q", group)
			}
			ids := allocationIDs(t, kind, dir)
			// The next job starts with a clean output file.
			for _, f := range []string{"output", "summary", "gpupass.env"} {
				os.Remove(filepath.Join(dir, f))
			}
			w := &gpupass.WaitOptions{Global: &gpupass.GlobalOptions{Output: output.Format(kind)}, Broker: gpupass.BrokerFlags{URL: url, Token: tok},
				IDs: []string{group}, Getenv: getenv}
			out.Reset()
			err := gpupass.RunWait(context.Background(), w, &out, &log)
			if code := gpupass.ExitCode(err); code != gpupass.ExitFindings {
				t.Fatalf("wait: exit %d (%v), want %d\n%s", code, err, gpupass.ExitFindings, out.String())
			}
			if got := stepOutput(t, kind, dir, "group"); got != group {
				t.Errorf("wait's group output %q, want %q", got, group)
			}
			if got := allocationIDs(t, kind, dir); len(got) != 2 || got["us-west-2"] != ids["us-west-2"] || got["eu-central-1"] != ids["eu-central-1"] {
				t.Errorf("wait's allocation-ids %v, want %v", got, ids)
			}
			if kind == "github" {
				// The wait job's summary is headed as wait's, not as a
				// second train's.
				if b, _ := os.ReadFile(filepath.Join(dir, "summary")); !strings.HasPrefix(string(b), "### gpupass wait\n") || !strings.Contains(string(b), ids["eu-central-1"]) {
					t.Errorf("wait's job summary:\n%s\nwant it headed ### gpupass wait, with the runs", b)
				}
			}
			if strings.Contains(out.String()+log.String()+err.Error(), tok) {
				t.Error("the token reached the output")
			}
		})
	}
}

// stepOutput reads one output of a step back as the next job does.
func stepOutput(t *testing.T, kind, dir, name string) string {
	t.Helper()
	if kind == "github" {
		b, _ := os.ReadFile(filepath.Join(dir, "output"))
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, name+"<<") && i+1 < len(lines) {
				return lines[i+1]
			}
		}
		return ""
	}
	b, _ := os.ReadFile(filepath.Join(dir, "gpupass.env"))
	key := "GPUPASS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "="
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			return v
		}
	}
	return ""
}

// Issue #35: compare takes a run group id, as an argument and in --runs
// (the compare-report step's input), and compares the group's runs
// labelled by region; a group given a name is refused with the way out.
func TestCompareGroup(t *testing.T) {
	t.Parallel()
	url, tok := runsBroker(t, false)
	spec := writeH100Spec(t)
	broker := []string{"--broker-url", url, "--broker-token", tok}
	code, out, errOut := runMain(t, append([]string{"train", "--follow", "--spec", spec, "--min-health-score", "0", "--region", "us-west-2,eu-central-1"}, append(broker, "--", "true")...)...)
	group := groupRE.FindString(out)
	if code != 0 || group == "" {
		t.Fatalf("train --follow: exit %d, group %q\n%s\n%s", code, group, out, errOut)
	}
	for _, args := range [][]string{{group}, {"--runs", group}} {
		code, out, errOut := runMain(t, append(append([]string{"compare", "-o", "json"}, args...), broker...)...)
		var rep struct {
			Runs []struct{ Label string } `json:"runs"`
		}
		if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil {
			t.Fatalf("compare %v: exit %d, %v\n%s\n%s", args, code, err, out, errOut)
		}
		var labels []string
		for _, r := range rep.Runs {
			labels = append(labels, r.Label)
		}
		if !slices.Equal(labels, []string{"us-west-2", "eu-central-1"}) {
			t.Errorf("compare %v compared %v, want the group's runs labelled us-west-2 and eu-central-1\n%s", args, labels, out)
		}
	}
	code, _, errOut = runMain(t, append([]string{"compare", "--label", "mine=" + group}, broker...)...)
	if code != gpupass.ExitUsage || !strings.Contains(errOut, "a run group stands for several runs") {
		t.Errorf("compare --label mine=%s: exit %d, want %d refusing a named group:\n%s", group, code, gpupass.ExitUsage, errOut)
	}
	// Given in --runs, the error names the flag the user typed too.
	code, _, errOut = runMain(t, append([]string{"compare", "--runs", "mine=" + group}, broker...)...)
	if code != gpupass.ExitUsage || !strings.Contains(errOut, `--label or --runs "mine=`+group+`": a run group stands for several runs`) {
		t.Errorf("compare --runs mine=%s: exit %d, want %d naming --runs:\n%s", group, code, gpupass.ExitUsage, errOut)
	}
}
