package executor_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
)

// nanJob is a tiny trainer in sh: steps 1..6, a checkpoint (holding its
// step) every 2 steps, a NaN loss at step 4 on a fresh start, resuming
// from $GPUPASS_RESUME_FROM. It keeps going after the NaN (as a careless
// trainer would), so the guard has to stop it, and it saves a checkpoint
// right after the NaN step, which the restart must not pick.
const nanJob = `
start=0
if [ -n "$GPUPASS_RESUME_FROM" ]; then start=$(cat "$GPUPASS_RESUME_FROM"); echo "checkpoint: resumed from $GPUPASS_RESUME_FROM at step $start"; fi
i=$((start+1))
while [ $i -le 6 ]; do
  loss="0.$((10-i))"
  if [ $i -eq 4 ] && [ -z "$GPUPASS_RESUME_FROM" ]; then loss=%s; fi
  line="{\"step\":$i,\"loss\":$loss,\"ts\":\"$(date -u +%%Y-%%m-%%dT%%H:%%M:%%S.%%6NZ)\"}"
  %s
  # The pause keeps the checkpoint after the NaN step beyond the file
  # clock's tick (see newestCheckpoint).
  if [ $((i %% 2)) -eq 0 ]; then sleep 0.02; echo $i > "$GPUPASS_CHECKPOINT_DIR/ckpt-$i"; fi
  i=$((i+1))
  sleep 0.3
done
`

func TestNaNGuardRestartsFromCheckpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, token, emit string
	}{
		{"metrics file NaN", "NaN", `echo "$line" >> "$GPUPASS_METRICS_FILE"`},
		{"stdout Infinity", "Infinity", `echo "gpupass:metric $line"`},
		// A script that prints its own log lines, as PyTorch's examples do.
		{"stdout plain text nan", "nan", `echo "| epoch   1 | step $i | lr 20.00 | loss  $loss | ppl 1.5"`},
		{"stderr printed dict inf", "inf", `echo "{'loss': $loss, 'step': $i}" >&2`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			script := writeScript(t, fmt.Sprintf(nanJob, tt.token, tt.emit))
			out := execute(t, context.Background(), executor.Job{Command: []string{script}, MaxRestarts: 3, Grace: 5 * time.Second},
				&executor.Executor{MetricsPoll: 10 * time.Millisecond})
			if out.res.State != executor.Succeeded || out.res.Restarts != 1 || out.res.Attempts != 2 {
				t.Fatalf("result %+v", out.res)
			}
			var restarts []events.Event
			for _, e := range out.find(events.NaNGuard) {
				if e.Level == events.Error {
					restarts = append(restarts, e)
				}
			}
			ckpt2 := filepath.Join(out.res.WorkDir, "checkpoints", "ckpt-2")
			if len(restarts) != 1 || restarts[0].Fields["step"] != "4" || restarts[0].Fields["resume_from"] != ckpt2 ||
				!strings.Contains(restarts[0].Message, "at step 4") || !strings.Contains(restarts[0].Message, "restart 1 of 3 from "+ckpt2) {
				t.Fatalf("restart events %+v, want one ERROR naming step 4 and %s", restarts, ckpt2)
			}
			var resumed bool
			for _, e := range out.find("checkpoint") {
				resumed = resumed || e.Message == "resumed from "+ckpt2+" at step 2"
			}
			if !resumed {
				t.Error("the second attempt did not get GPUPASS_RESUME_FROM")
			}
			type pt struct {
				Step    int64
				Attempt int
				Loss    float64
			}
			var got []pt
			for _, m := range events.Continuous(out.metrics) {
				got = append(got, pt{m.Step, m.Attempt, m.Values["loss"]})
			}
			want := []pt{{1, 1, .9}, {2, 1, .8}, {3, 2, .7}, {4, 2, .6}, {5, 2, .5}, {6, 2, .4}}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("continuous series (-want +got):\n%s", d)
			}
		})
	}
}

// TestTextLossesYieldToMetricsFile: a trainer that writes each step to
// $GPUPASS_METRICS_FILE and also prints `step N loss X` (as
// examples/train/train.py does) has one series, the file's: its printed
// lines are not recorded as metrics a second time, even when printed
// before the agent's next look at the file.
func TestTextLossesYieldToMetricsFile(t *testing.T) {
	t.Parallel()
	script := writeScript(t, `for i in 1 2 3; do echo "{\"step\":$i,\"loss\":0.$i}" >> "$GPUPASS_METRICS_FILE"; echo "trainer: step $i loss 0.$i"; done`)
	out := execute(t, context.Background(), executor.Job{Command: []string{script}, Grace: 5 * time.Second},
		&executor.Executor{MetricsPoll: time.Hour})
	if out.res.State != executor.Succeeded {
		t.Fatalf("result %+v", out.res)
	}
	var got []string
	for _, m := range out.metrics {
		got = append(got, fmt.Sprintf("%d:%g:%s", m.Step, m.Values["loss"], m.Source))
	}
	if want := "1:0.1:file 2:0.2:file 3:0.3:file"; strings.Join(got, " ") != want {
		t.Errorf("metrics %v, want %s", got, want)
	}
}

func TestNaNGuardGivesUp(t *testing.T) {
	t.Parallel()
	script := writeScript(t, `echo '{"step":1,"loss":NaN}' >> "$GPUPASS_METRICS_FILE"; sleep 30`)
	out := execute(t, context.Background(), executor.Job{Command: []string{script}, MaxRestarts: 2, Grace: 5 * time.Second},
		&executor.Executor{MetricsPoll: 10 * time.Millisecond})
	res := out.res
	if res.State != executor.Failed || res.Restarts != 2 || res.Attempts != 3 || !strings.Contains(res.Reason, "non-finite loss NaN at step 1; giving up after 2 restart(s)") {
		t.Fatalf("result %+v", res)
	}
	n := 0
	for _, e := range out.find(events.NaNGuard) {
		if e.Level == events.Error {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d nan-guard ERROR events, want 3 (two restarts and the final one)", n)
	}
	for _, m := range out.metrics {
		if !math.IsNaN(m.Values["loss"]) {
			t.Errorf("metric %+v", m)
		}
	}
	if _, err := os.Stat(filepath.Join(res.WorkDir, "metrics.jsonl")); err != nil {
		t.Error(err)
	}
}
