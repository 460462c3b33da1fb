//go:build e2e

package gpupass_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestCompareScriptLogsE2E runs the built `gpupass compare` on two logs
// of PyTorch's word_language_model example and on a Hugging Face Trainer
// log against an MLflow run, as a user pastes them: the report has
// their losses, and no ordinary line is called malformed.
func TestCompareScriptLogsE2E(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./cmd/gpupass")
	logs := filepath.Join(testutil.RepoRoot(t), "internal", "metrics", "testdata", "logs")
	gp := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = logs
		cmd.Env = append(os.Environ(), "GITHUB_ACTIONS=", "GITLAB_CI=", "GITHUB_STEP_SUMMARY=", "GPUPASS_METRIC_PATTERN=", "GPUPASS_STATE_DIR="+t.TempDir())
		return testutil.Run(t, cmd)
	}
	out, errOut, code := gp("compare", "word_language_model.us.log", "word_language_model.eu.log", "--fail-on-divergence")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"✅ gpupass compare: consistent", "| 5.2 ", "| 5.18 ", "200..5783 (28 pts)",
		"read as a text log: 28 of 38 line(s) had loss", "step: epoch and N/M batch position"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+errOut, "malformed") {
		t.Errorf("ordinary lines called malformed:\n%s\n%s", out, errOut)
	}
	out, errOut, code = gp("compare", "-o", "json", "--label", "hf=hf_trainer.log", "--label", "mlflow=mlruns")
	var rep struct {
		Runs []struct {
			Label, Format string
			Points        int
			FinalLoss     float64 `json:"final_loss"`
			Notes         []string
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Runs) != 2 {
		t.Fatalf("hf vs mlflow: exit %d\n%s\n%s", code, out, errOut)
	}
	if r := rep.Runs[0]; r.Format != "text" || r.Points != 7 || r.FinalLoss != 1.2465 || !strings.Contains(strings.Join(r.Notes, ";"), "step: line order") {
		t.Errorf("hf run %+v", r)
	}
	if r := rep.Runs[1]; r.Format != "mlflow" || r.Points != 10 || r.FinalLoss != 0.731065 {
		t.Errorf("mlflow run %+v", r)
	}
}

// wlmScript prints what PyTorch's word_language_model example prints,
// with its own format strings: training lines every 200 batches, a
// validation line after each epoch and a test line at the end.
const wlmScript = `import math, sys, time
nb = 2983
k = 0
for epoch in range(1, 3):
    for batch in range(200, nb, 200):
        cur_loss = 7.63 - 0.09 * k
        k += 1
        print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
              'loss {:5.2f} | ppl {:8.2f}'.format(epoch, batch, nb, 20.0, 45.41, cur_loss, math.exp(cur_loss)), flush=True)
        time.sleep(0.01)
    print('-' * 89)
    print('| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | '
          'valid ppl {:8.2f}'.format(epoch, 1.5, 1.0, math.exp(1.0)), flush=True)
    print('-' * 89)
print('=' * 89)
print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'.format(0.5, math.exp(0.5)), flush=True)
print('=' * 89)
`

// TestTrainScriptOwnLog trains an unmodified-style script through the
// real broker and agent: the agent reads the losses from its printed
// lines (no gpupass:metric, no metrics file), the broker records them,
// and `gpupass compare ALLOC` reports them.
func TestTrainScriptOwnLog(t *testing.T) {
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	spec, err := os.ReadFile(filepath.Join(stack.Root, "examples", "train", "gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"gpupass.yaml": string(spec), "main.py": wlmScript} {
		if err := os.WriteFile(filepath.Join(work, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gp := func(args ...string) (string, string, int) {
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(cmd.Env, "GITHUB_ACTIONS=", "GITLAB_CI=", "GITHUB_STEP_SUMMARY=", "GPUPASS_BROKER_URL=", "GPUPASS_BROKER_TOKEN=", "GPUPASS_METRIC_PATTERN=")
		return testutil.Run(t, cmd)
	}
	out, errOut, code := gp("train", "--spec", filepath.Join(work, "gpupass.yaml"), "--workdir", work, "--name", "wlm", "--region", "us-west-2", "--follow", "--", py, "main.py")
	if code != 0 {
		t.Fatalf("train: exit %d\n%s\n%s", code, upstack.Tail(out, 3000), errOut)
	}
	resp, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, r := range resp.Msg.Runs {
		if r.Name == "wlm-us-west-2" {
			id = r.Id
		}
	}
	if id == "" {
		t.Fatalf("no run wlm-us-west-2 in %v", resp.Msg.Runs)
	}
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
	if err != nil {
		t.Fatal(err)
	}
	// 14 training lines an epoch, two epochs; steps (epoch-1)*2983+batch.
	var steps []int64
	k := 0
	for _, p := range mr.Msg.Points {
		v, ok := p.Values["loss"]
		if !ok {
			continue
		}
		want := math.Round((7.63-0.09*float64(k))*100) / 100
		wantStep := int64(k/14*2983 + (k%14+1)*200)
		if p.Source != "text" || p.Step != wantStep || math.Abs(v-want) > 1e-9 {
			t.Errorf("point %d: step %d loss %v source %q, want step %d loss %v from text", k, p.Step, v, p.Source, wantStep, want)
		}
		steps = append(steps, p.Step)
		k++
	}
	if k != 28 {
		t.Fatalf("the broker recorded %d loss points %v, want the 28 training lines (not the valid and test losses)", k, steps)
	}
	out, errOut, code = gp("compare", id, "-o", "json")
	if code != 0 || !strings.Contains(out, `"final_loss": 5.2`) || !strings.Contains(out, "28 of its loss values were read by the agent from the job's own log lines") {
		t.Errorf("compare %s: exit %d\n%s\n%s", id, code, out, errOut)
	}

	// A form no built-in reads, with train --metric-pattern: the run's
	// spec carries the pattern to the agent.
	if err := os.WriteFile(filepath.Join(work, "main.py"), []byte("for i in range(1, 6):\n    print(f'it={i} xent {3.0 - i / 10:.2f}', flush=True)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = gp("train", "--spec", filepath.Join(work, "gpupass.yaml"), "--workdir", work, "--name", "xent", "--region", "us-west-2", "--follow",
		"--metric-pattern", `it=(?P<step>\d+) xent (?P<loss>\S+)`, "--", py, "main.py")
	if code != 0 {
		t.Fatalf("train --metric-pattern: exit %d\n%s\n%s", code, upstack.Tail(out, 3000), errOut)
	}
	resp, err = rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Msg.Runs {
		if r.Name == "xent-us-west-2" {
			id = r.Id
		}
	}
	mr, err = rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range mr.Msg.Points {
		got = append(got, fmt.Sprintf("%d:%g:%s", p.Step, p.Values["loss"], p.Source))
	}
	if want := "1:2.9:text 2:2.8:text 3:2.7:text 4:2.6:text 5:2.5:text"; strings.Join(got, " ") != want {
		t.Errorf("run %s points %v, want %s", id, got, want)
	}
}
