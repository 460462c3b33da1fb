package gpupass

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// publicLogs holds logs in the formats public training scripts print
// (internal/metrics/testdata/logs/README.md names them).
var publicLogs = filepath.Join("..", "..", "metrics", "testdata", "logs")

// TestCompareScriptLogs compares the logs of unmodified scripts: PyTorch's
// word_language_model prints `| loss  7.63 |`, which compare used to call
// 38 malformed lines and no loss.
func TestCompareScriptLogs(t *testing.T) {
	env := map[string]string{"GITHUB_ACTIONS": "", "GITLAB_CI": "", "GITHUB_STEP_SUMMARY": "", "GPUPASS_METRIC_PATTERN": ""}
	logs, _ := filepath.Abs(publicLogs)
	t.Chdir(t.TempDir()) // no gpupass.yaml here
	us, eu := filepath.Join(logs, "word_language_model.us.log"), filepath.Join(logs, "word_language_model.eu.log")
	out, stderr, code := runCLI(t, env, "--post", "none", "--label", "us="+us, "--label", "eu="+eu)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"✅ gpupass compare: consistent",
		"| us  | ", "word\\_language\\_model.us.log", "| 5.2 ", "200..5783 (28 pts)", "| eu  | ", "| 5.18 ",
		"us: read as a text log: 28 of 38 line(s) had loss by the built-in forms",
		"step: epoch and N/M batch position",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "malformed") || strings.Contains(stderr, "malformed") {
		t.Errorf("ordinary log lines reported as malformed:\n%s\n%s", out, stderr)
	}

	// The flag, through its environment variable as CI sets it.
	out, stderr, code = runCLI(t, map[string]string{"GPUPASS_METRIC_PATTERN": `\| loss\s+(?P<loss>\S+) \|`}, "--post", "none", us, eu)
	if code != 0 || !strings.Contains(out, "by the metric pattern '") || !strings.Contains(out, "; step: line order") || !strings.Contains(out, "1..28 (28 pts)") {
		t.Errorf("--metric-pattern: exit %d %s\n%s", code, stderr, out)
	}

	// Hugging Face Trainer's printed dicts against an MLflow run.
	out, stderr, code = runCLI(t, env, "--post", "none", "-o", "json", filepath.Join(logs, "hf_trainer.log"), filepath.Join(logs, "mlruns"))
	if code != 0 || !strings.Contains(out, `"format": "text"`) || !strings.Contains(out, `"format": "mlflow"`) {
		t.Errorf("hf and mlflow: exit %d %s\n%s", code, stderr, out)
	}
}

// TestCompareMetricPatternFromSpec: CI needs no flag when the spec in the
// working directory has metrics.pattern; a bad one is named by file, line
// and column, a bad flag by the flag.
func TestCompareMetricPatternFromSpec(t *testing.T) {
	env := map[string]string{"GITHUB_ACTIONS": "", "GITLAB_CI": "", "GITHUB_STEP_SUMMARY": "", "GPUPASS_METRIC_PATTERN": ""}
	dir := t.TempDir()
	log := filepath.Join(dir, "run.log")
	if err := os.WriteFile(log, []byte("it=1 xent 2.5\nit=2 xent 2.25\nit=3 xent nan\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(filepath.Join(publicLogs, "keras.log"))
	t.Chdir(dir)
	_, stderr, code := runCLI(t, env, "--post", "none", log, abs)
	if code != ExitUsage || !strings.Contains(stderr, "run.log: no loss values found; read 3 line(s) as a text log") || !strings.Contains(stderr, "give --metric-pattern that finds the value") {
		t.Errorf("no pattern: exit %d %s", code, stderr)
	}
	spec := "name: x\nruntime:\n  cuda: 12.1.105\n  nvidia-driver: 535.104.05\n  python: 3.10.12\n  pytorch: 2.1.2+cu121\nmetrics:\n  pattern: 'it=(?P<step>\\d+) xent (?P<loss>\\S+)'\n"
	if err := os.WriteFile("gpupass.yaml", []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	// Two runs of one log (one run under two labels is refused).
	log2 := filepath.Join(dir, "run2.log")
	if err := os.WriteFile(log2, []byte("it=1 xent 2.5\nit=2 xent 2.25\nit=3 xent nan\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := runCLI(t, env, "--post", "none", "--label", "a="+log, "--label", "b="+log2)
	if code != 0 || !strings.Contains(out, "step: the pattern's step group") || !strings.Contains(out, "1..3 (3 pts)") {
		t.Errorf("spec pattern: exit %d %s\n%s", code, stderr, out)
	}
	if err := os.WriteFile("gpupass.yaml", []byte(strings.Replace(spec, "it=(?P<step>", "(?<=it=)(?P<step>", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runCLI(t, env, "--post", "none", log)
	if code != ExitUsage || !strings.Contains(stderr, "gpupass.yaml:8:12: metrics.pattern:") || !strings.Contains(stderr, "do not support lookarounds") {
		t.Errorf("bad spec pattern: exit %d %s", code, stderr)
	}
	_, stderr, code = runCLI(t, env, "--post", "none", "--metric-pattern", "xent ([0-9.]+)", log)
	if code != ExitUsage || !strings.Contains(stderr, `--metric-pattern "xent ([0-9.]+)": the pattern has no group named value or loss`) {
		t.Errorf("bad flag: exit %d %s", code, stderr)
	}
}
