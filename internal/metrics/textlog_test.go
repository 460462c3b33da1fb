package metrics

import (
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestPublicScriptLogs reads logs in the formats of public training
// scripts (testdata/logs/README.md names them) and compares what is
// extracted with testdata/logs/golden.
func TestPublicScriptLogs(t *testing.T) {
	t.Parallel()
	wlmPattern := mustPattern(t, `\| loss\s+(?P<loss>\S+) \|`)
	tests := []struct {
		name, path string
		opt        Options
	}{
		{"word_language_model", "word_language_model.us.log", Options{}},
		{"word_language_model_pattern", "word_language_model.us.log", Options{Pattern: wlmPattern}},
		{"word_language_model_ppl", "word_language_model.us.log", Options{Metric: "ppl"}},
		{"mnist", "mnist.log", Options{}},
		{"hf_trainer", "hf_trainer.log", Options{}},
		{"lightning", "lightning.log", Options{}},
		{"keras", "keras.log", Options{}},
		{"mlflow_store", "mlruns", Options{}},
		{"mlflow_run", "mlruns/0/4f1c2a9be0d84b6e9c3a8f7d2e1b0a95", Options{}},
		{"mlflow_metric_file", "mlruns/0/4f1c2a9be0d84b6e9c3a8f7d2e1b0a95/metrics/val_loss", Options{}},
		{"mlflow_val_loss", "mlruns/0", Options{Metric: "val_loss"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := ReadFile(filepath.Join("testdata", "logs", tc.path), tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "source: %s\nformat: %s\nmetric: %s\n", s.Source, s.Format, s.Metric)
			for _, n := range s.Notes {
				fmt.Fprintf(&b, "note: %s\n", n)
			}
			if s.Problems.Count > 0 {
				fmt.Fprintf(&b, "problems: %s\n", s.Problems)
			}
			for _, p := range s.Points {
				fmt.Fprintf(&b, "%d %s\n", p.Step, strconv.FormatFloat(p.Value, 'g', -1, 64))
			}
			golden := filepath.Join("testdata", "logs", "golden", tc.name+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if d := cmp.Diff(string(want), b.String()); d != "" {
				t.Errorf("%s (-want +got):\n%s", golden, d)
			}
		})
	}
}

func mustPattern(t *testing.T, expr string) *Pattern {
	t.Helper()
	p, err := CompilePattern(expr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLineReaderForms reads one line at a time, as the agent does.
func TestLineReaderForms(t *testing.T) {
	t.Parallel()
	type got struct {
		Step  int64
		Value string
		OK    bool
		Err   string
	}
	tests := []struct {
		name, line string
		want       got
	}{
		{"space", "| loss  7.89 | ppl 2659.32", got{1, "7.89", true, ""}},
		{"equals", "loss=7.89", got{1, "7.89", true, ""}},
		{"colon", "Loss: 7.89", got{1, "7.89", true, ""}},
		{"printed dict", "{'loss': 7.89, 'epoch': 0.1}", got{1, "7.89", true, ""}},
		{"json", `{"loss": 7.89}`, got{1, "7.89", true, ""}},
		{"train_loss", "train_loss=0.5", got{1, "0.5", true, ""}},
		{"lightning step", "train_loss_step=0.5", got{1, "0.5", true, ""}},
		{"exponent", "loss 1.2e-3", got{1, "0.0012", true, ""}},
		{"nan", "loss nan", got{1, "NaN", true, ""}},
		{"NaN capital", "step 3 loss: NaN", got{3, "NaN", true, ""}},
		{"inf", "loss=inf", got{1, "+Inf", true, ""}},
		{"-inf", "loss -inf", got{1, "-Inf", true, ""}},
		{"step field", "step 120 | loss 2.5", got{120, "2.5", true, ""}},
		{"iter field", "iter: 7, loss: 2.5", got{7, "2.5", true, ""}},
		{"epoch and batch", "| epoch   2 |   200/ 2983 batches | loss  5.00", got{3183, "5", true, ""}},
		{"valid loss is not training loss", "| end of epoch 1 | valid loss  5.92", got{}},
		{"val_loss", "val_loss: 0.14", got{}},
		{"eval_loss", "{'eval_loss': 1.2}", got{}},
		{"mnist test set", "Test set: Average loss: 0.1004, Accuracy: 9688/10000 (97%)", got{}},
		{"loss_scale", "loss_scale 65536", got{}},
		{"closs", "closs 1.0", got{}},
		{"no number", "loss went down", got{}},
		{"hf summary", "{'train_runtime': 73.2, 'train_loss': 1.82, 'epoch': 3.0}", got{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			step, v, ok, err := NewLineReader("", nil).Read([]byte(tc.line))
			g := got{Step: step, OK: ok}
			if ok {
				g.Value = strconv.FormatFloat(v, 'g', -1, 64)
			}
			if err != nil {
				g.Err = err.Error()
			}
			if d := cmp.Diff(tc.want, g); d != "" {
				t.Errorf("%q (-want +got):\n%s", tc.line, d)
			}
		})
	}
}

// TestLineReaderKeepsStepSource: once a log's steps come from a field,
// a later metric line without it is a problem, not a point at a made-up
// step.
func TestLineReaderKeepsStepSource(t *testing.T) {
	t.Parallel()
	r := NewLineReader("", nil)
	if s, _, ok, _ := r.Read([]byte("step 10 loss 2")); !ok || s != 10 {
		t.Fatalf("first line: step %d ok %v", s, ok)
	}
	_, _, ok, err := r.Read([]byte("loss 1.5"))
	if ok || err == nil || !strings.Contains(err.Error(), "no step on this line (the log's steps come from the step/iter field)") {
		t.Fatalf("ok %v err %v", ok, err)
	}
	if r.StepFrom() != StepField {
		t.Errorf("StepFrom %q", r.StepFrom())
	}
}

// TestNewLineReaderReusesLossKey: the training loss's expression is
// compiled once for the package, not once per reader (a run attempt in
// the agent, a file in compare).
func TestNewLineReaderReusesLossKey(t *testing.T) {
	for _, metric := range []string{"", "loss"} {
		if n := testing.AllocsPerRun(10, func() { NewLineReader(metric, nil) }); n > 1 {
			t.Errorf("NewLineReader(%q, nil): %v allocations, want at most 1 (the reader)", metric, n)
		}
	}
}

func TestCompilePatternErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ expr, want string }{
		{"", "the pattern is empty"},
		{`loss (?=\d)(?P<loss>\S+)`, "do not support lookarounds"},
		{`(?<!val_)loss (?P<loss>\S+)`, "do not support lookarounds"},
		{`loss (\S+)`, "no group named value or loss"},
		{`(?P<loss>\d+) (?P<value>\d+)`, "more than one value group"},
		{`loss ([0-9`, "not a valid regular expression: error parsing regexp: missing closing ]"},
		{strings.Repeat("a", MaxPatternLen+1), "more than 1024"},
	}
	for _, tc := range tests {
		_, err := CompilePattern(tc.expr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CompilePattern(%.40q): %v, want %q", tc.expr, err, tc.want)
		}
	}
	p, err := CompilePattern(`it (?P<step>\d+): (?P<value>\S+)`)
	if err != nil {
		t.Fatal(err)
	}
	step, v, ok, err := NewLineReader("", p).Read([]byte("it 5: nan"))
	if !ok || err != nil || step != 5 || !math.IsNaN(v) {
		t.Errorf("pattern read: %d %v %v %v", step, v, ok, err)
	}
}

// TestTextLogEmpty: a log with no metric says what it read and what to
// pass, without calling every ordinary line malformed.
func TestTextLogEmpty(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "train.log")
	if err := os.WriteFile(p, []byte("starting\nepoch 1 done\naccuracy 0.9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadFile(p, Options{})
	if err == nil || !strings.Contains(err.Error(), "read 3 line(s) as a text log") || strings.Contains(err.Error(), "malformed") ||
		!strings.Contains(err.Error(), "a metric pattern that finds the value") {
		t.Fatalf("error %v", err)
	}
}

// FuzzLineReader: any line, in any order after any other, reads without
// a panic and with a step inside ±MaxStep.
func FuzzLineReader(f *testing.F) {
	for _, s := range []string{"| epoch   1 |   200/ 2983 batches | loss  7.63", "step 3 loss nan", "{'loss': 1e-3, 'epoch': 0.1}",
		"epoch 99999999999999999 | 9999999999999999/3 batches | loss 1", "Epoch 0: 50%|| 50/100 [00:05, train_loss=0.693]"} {
		f.Add(s, "epoch 1 | loss 2")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		r := NewLineReader("", nil)
		for _, line := range []string{a, b, a} {
			step, _, ok, _ := r.Read([]byte(line))
			if ok && (step > MaxStep || step < -MaxStep) {
				t.Fatalf("step %d out of range for %q", step, line)
			}
		}
	})
}

// TestInitCompilesNothing: the package's initialisation compiles none of
// the text-log expressions (about 600 allocations and 0.2 ms when it
// did), since every gpupass binary links the package and most commands
// read no text log. It reads the init trace of this test binary run
// again with no test.
func TestInitCompilesNothing(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := regexp.MustCompile(`init github.com/gpupass/gpupass/internal/metrics @.* (\d+) allocs`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no init trace of the package in:\n%s", out)
	}
	if n, _ := strconv.Atoi(string(m[1])); n > 100 {
		t.Errorf("the package's initialisation made %d allocations, want at most 100 (compile expressions on first use, sync.OnceValue): %s", n, m[0])
	}
}
