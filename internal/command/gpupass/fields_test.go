package gpupass

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// TestFieldNames: every flag the table names exists, so a renamed error
// never sends the user to a flag that is not there.
func TestFieldNames(t *testing.T) {
	t.Parallel()
	flags := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { flags[f.Name] = true })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { flags[f.Name] = true })
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(NewRoot())
	flagRE := regexp.MustCompile(`--([a-z0-9-]+)`)
	for field, name := range flagNames {
		for _, m := range flagRE.FindAllStringSubmatch(name, -1) {
			if !flags[m[1]] {
				t.Errorf("flagNames[%q] = %q: gpupass has no flag --%s", field, name, m[1])
			}
		}
	}
}

// TestLibraryErrorsNameFlagOrInput: a library refuses a value in its own
// terms (*fielderr.Error); `gpupass compare` names the flag the user
// typed and, as a CI step (-o github), also its variable and input.
func TestLibraryErrorsNameFlagOrInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	us, eu := filepath.Join(dir, "us.jsonl"), filepath.Join(dir, "eu.jsonl")
	writeMetrics(t, us, 0)
	writeMetrics(t, eu, 0.001)
	csv := filepath.Join(dir, "metrics.csv")
	if err := os.WriteFile(csv, []byte("step,train_loss\n0,3\n10,2.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		cli       []string
		wantCLI   string
		ci        []string // the flags of the same command as a CI step (-o github) sets them; nil: no input sets it
		wantInput string
	}{
		{
			name:      "comment behavior",
			cli:       []string{"compare", us, eu, "--comment-behavior", "sometimes"},
			wantCLI:   `--comment-behavior "sometimes": must be update, new or delete-and-new`,
			ci:        []string{"-o", "github", "compare", "--runs", us + " " + eu, "--comment-behavior", "sometimes", "--report-dir", filepath.Join(dir, "rep")},
			wantInput: `--comment-behavior (GPUPASS_COMMENT_BEHAVIOR, the comment-behavior input) "sometimes": must be update, new or delete-and-new`,
		},
		{
			name:    "time limit",
			cli:     []string{"train", "--region", "us", "--time-limit", "45d", "--", "true"},
			wantCLI: `--time-limit "45d": "45d" is not a duration such as 90m or 2h30m`,
		},
		{
			name:    "metric",
			cli:     []string{"compare", csv, csv, "--metric", "val_loss"},
			wantCLI: `--metric "val_loss": ` + csv + ` has no such column (columns: step,train_loss)`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := Main(context.Background(), tt.cli, strings.NewReader(""), &out, &errb)
			if code != ExitUsage || !strings.Contains(errb.String(), tt.wantCLI) {
				t.Errorf("gpupass %s: exit %d, stderr %q; want %d and %q", strings.Join(tt.cli, " "), code, errb.String(), ExitUsage, tt.wantCLI)
			}
			if tt.ci == nil {
				return
			}
			out.Reset()
			errb.Reset()
			code = Main(context.Background(), tt.ci, strings.NewReader(""), &out, &errb)
			if code != ExitUsage || !strings.Contains(errb.String(), tt.wantInput) {
				t.Errorf("gpupass %s: exit %d, stderr %q; want %d and %q", strings.Join(tt.ci, " "), code, errb.String(), ExitUsage, tt.wantInput)
			}
		})
	}
}

// A plugin field that the CLI already names otherwise is a programming
// error found at start, not one table silently winning.
func TestMergeNamesRefusesAClash(t *testing.T) {
	t.Parallel()
	m := mergeNames(fielderr.Names{"a": "--a"}, fielderr.Names{"a": "--a", "b": "--b"})
	if len(m) != 2 || m["b"] != "--b" {
		t.Errorf("merged %v, want a and b", m)
	}
	defer func() {
		if recover() == nil {
			t.Error("a field named twice did not panic")
		}
	}()
	mergeNames(fielderr.Names{"a": "--a"}, fielderr.Names{"a": "--other"})
}
