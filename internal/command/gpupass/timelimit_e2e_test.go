//go:build e2e

package gpupass_test

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2ETimeLimit: `gpupass train --time-limit 2s` of a job that sleeps
// far past it, on a real agent (local executor) under `gpupass up`: the
// agent stops the job at the limit, the run ends failed with TIMEOUT,
// train --follow exits 1, and `gpupass runs` shows the limit and the
// reason.
func TestE2ETimeLimit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	var out upstack.Buffer
	train := stack.Command(ctx, "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--name", "timeout",
		"--time-limit", "2s", "--follow", "--", "sh", "-c", "echo started; exec sleep 600")
	train.Stdout, train.Stderr = &out, &out
	err := train.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("train --follow: %v, want exit 1 (the run failed)\n%s", err, upstack.Tail(out.String(), 4000))
	}
	for _, want := range []string{"started", "TIMEOUT: time limit 2s reached"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the followed log lacks %q:\n%s", want, upstack.Tail(out.String(), 4000))
		}
	}
	runs, err := stack.Command(ctx, "runs").CombinedOutput()
	if err != nil {
		t.Fatalf("gpupass runs: %v\n%s", err, runs)
	}
	if !regexp.MustCompile(`timeout-us-west-2 .* failed.* 2s +TIMEOUT: time limit 2s reached`).Match(runs) {
		t.Errorf("gpupass runs does not show the run failed with its limit and TIMEOUT:\n%s", runs)
	}
}
