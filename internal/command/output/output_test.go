package output_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/command/output"
)

// tree is a binary's root as the binaries build it: -o registered once,
// the environment applied, then Check, before any command runs.
func tree(env map[string]string, ran *output.Format) *cobra.Command {
	var f output.Format
	root := &cobra.Command{
		Use: "tool", SilenceUsage: true, SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagenv.Apply(cmd, func(k string) string { return env[k] }); err != nil {
				return err
			}
			return output.Check(cmd)
		},
	}
	output.Register(root, &f)
	run := func(*cobra.Command, []string) error { *ran = f; return nil }
	plain := &cobra.Command{Use: "plain", RunE: run}
	ci := &cobra.Command{Use: "ci", RunE: run}
	output.Supports(ci, output.Text, output.JSON, output.GitHub, output.GitLab)
	ciSub := &cobra.Command{Use: "sub", RunE: run}
	ci.AddCommand(ciSub)
	audit := &cobra.Command{Use: "audit", RunE: run}
	audit.Flags().String("out", "audit-report.zip", "the zip")
	output.WritesFileWith(audit, "out", "the zip")
	// A command with SARIF and an old --format, as validate.
	findings := &cobra.Command{Use: "findings", RunE: run}
	output.Supports(findings, output.Text, output.JSON, output.GitHub, output.GitLab, output.SARIF)
	output.Alias(findings, "format", "deprecated: use -o")
	root.AddCommand(plain, ci, audit, findings)
	return root
}

func TestFormatFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    output.Format // what the command saw
		wantErr string        // refused before it ran
	}{
		{name: "default", args: []string{"plain"}, want: output.Text},
		{name: "json", args: []string{"plain", "-o", "json"}, want: output.JSON},
		{name: "long flag before the command", args: []string{"--output=json", "plain"}, want: output.JSON},
		{name: "from the environment", args: []string{"plain"}, env: map[string]string{"GPUPASS_OUTPUT": "json"}, want: output.JSON},
		{name: "the flag over the environment", args: []string{"plain", "-o", "text"}, env: map[string]string{"GPUPASS_OUTPUT": "json"}, want: output.Text},
		{name: "unknown", args: []string{"plain", "-o", "yaml"},
			wantErr: `--output "yaml" (or GPUPASS_OUTPUT): must be text or json`},
		{name: "unknown from the environment", args: []string{"plain"}, env: map[string]string{"GPUPASS_OUTPUT": "yaml"},
			wantErr: `--output "yaml" (or GPUPASS_OUTPUT): must be text or json`},
		{name: "a CI format where none is declared", args: []string{"plain", "-o", "github"},
			wantErr: "--output github: tool plain prints text or json"},
		{name: "a CI format where declared", args: []string{"ci", "-o", "gitlab"}, want: output.GitLab},
		{name: "declared formats are inherited", args: []string{"ci", "sub", "-o", "github"}, want: output.GitHub},
		{name: "unknown where CI formats are declared", args: []string{"ci", "-o", "yaml"},
			wantErr: `--output "yaml" (or GPUPASS_OUTPUT): must be text, json, github or gitlab`},
		// SARIF is a format of the commands that declare it only.
		{name: "sarif where not declared", args: []string{"ci", "-o", "sarif"},
			wantErr: "--output sarif: tool ci prints text, json, github or gitlab"},
		{name: "sarif on a plain command", args: []string{"plain", "-o", "sarif"},
			wantErr: "--output sarif: tool plain prints text or json"},
		{name: "sarif where declared", args: []string{"findings", "-o", "sarif"}, want: output.SARIF},
		{name: "the old flag is -o", args: []string{"findings", "--format", "sarif"}, want: output.SARIF},
		{name: "the old flag's variable is -o", args: []string{"findings"}, env: map[string]string{"GPUPASS_FORMAT": "gitlab"}, want: output.GitLab},
		{name: "the old flag with the same -o", args: []string{"findings", "-o", "json", "--format", "json"}, want: output.JSON},
		{name: "the old flag against -o", args: []string{"findings", "-o", "json", "--format", "sarif"},
			wantErr: "--format sarif with --output json: --format is the old name of --output; give -o sarif alone"},
		{name: "the old flag, unknown", args: []string{"findings", "--format", "xml"},
			wantErr: `--format "xml" (or GPUPASS_FORMAT): must be text, json, github, gitlab or sarif; --format is deprecated: use -o`},
		{name: "a zip given to -o", args: []string{"audit", "-o", "report.zip"},
			wantErr: "-o report.zip: --output is the output format (text or json); write the zip with --out report.zip"},
		{name: "a path that needs quoting", args: []string{"audit", "-o", "my report.zip"},
			wantErr: "-o 'my report.zip': --output is the output format (text or json); write the zip with --out 'my report.zip'"},
		{name: "a value a terminal would act on", args: []string{"audit", "-o", "x\x1b]0;owned\a.zip"},
			wantErr: `--output "x\x1b]0;owned\a.zip" (or GPUPASS_OUTPUT): must be text or json`},
		{name: "json where a file is written", args: []string{"audit", "-o", "json"}, want: output.JSON},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ran output.Format
			root := tree(tc.env, &ran)
			root.SetArgs(tc.args)
			root.SetOut(io.Discard)
			err := root.Execute()
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				if ran != "" {
					t.Errorf("the command ran (with %q) after the refusal", ran)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ran != tc.want {
				t.Errorf("the command saw %q, want %q", ran, tc.want)
			}
			// What a binary's main reads after the command, to name
			// flags as a CI step's inputs in its error.
			if got := output.Of(root); got != tc.want {
				t.Errorf("Of(root) after the run = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestOfWithoutTheFlag(t *testing.T) {
	t.Parallel()
	if got := output.Of(&cobra.Command{Use: "bare"}); got != output.Text {
		t.Errorf("Of of a command without -o = %q, want text", got)
	}
}

func TestCompletion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"plain", []string{"text", "json"}},
		{"ci", []string{"text", "json", "github", "gitlab"}},
	} {
		var ran output.Format
		root := tree(nil, &ran)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{cobra.ShellCompNoDescRequestCmd, tc.cmd, "-o", ""})
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if diff := cmp.Diff(append(tc.want, ":4"), lines); diff != "" {
			t.Errorf("%s -o <TAB> (-want +got):\n%s", tc.cmd, diff)
		}
	}
}

func TestCI(t *testing.T) {
	t.Parallel()
	for f, want := range map[output.Format]bool{output.Text: false, output.JSON: false, output.GitHub: true, output.GitLab: true} {
		if f.CI() != want {
			t.Errorf("%s.CI() = %v", f, !want)
		}
	}
}

type result struct {
	Name  string `json:"name"`
	Note  string `json:"note"`
	Count int    `json:"count"`
	Empty []int  `json:"empty"`
	text  string
}

func (r result) WriteText(w io.Writer) error {
	_, err := fmt.Fprintf(w, "%s: %s\n", r.Name, r.text)
	return err
}

type own struct{}

func (own) WriteJSON(w io.Writer) error { _, err := io.WriteString(w, "{\"own\":true}\n"); return err }
func (own) WriteText(w io.Writer) error { _, err := io.WriteString(w, "own\n"); return err }

func TestWrite(t *testing.T) {
	t.Parallel()
	r := result{Name: "a<b>&c", Note: "x", Count: 2, Empty: []int{}, text: "the text form"}
	tests := []struct {
		name    string
		f       output.Format
		v       any
		want    string
		wantErr string
	}{
		// Two-space indents, no HTML escaping, a trailing newline: the
		// bytes scripts and tests have parsed since --output json began.
		{name: "json", f: output.JSON, v: r, want: "{\n  \"name\": \"a<b>&c\",\n  \"note\": \"x\",\n  \"count\": 2,\n  \"empty\": []\n}\n"},
		{name: "text", f: output.Text, v: r, want: "a<b>&c: the text form\n"},
		{name: "text by default", f: "", v: r, want: "a<b>&c: the text form\n"},
		{name: "a result's own JSON", f: output.JSON, v: own{}, want: "{\"own\":true}\n"},
		{name: "no text form", f: output.Text, v: struct{}{}, wantErr: "output: struct {} has no text form"},
		// A CI step's log shows the text; the command adds the CI's own
		// channels beside it.
		{name: "github prints the text", f: output.GitHub, v: r, want: "a<b>&c: the text form\n"},
		{name: "gitlab prints the text", f: output.GitLab, v: r, want: "a<b>&c: the text form\n"},
		{name: "a format with no writer", f: "yaml", v: r, wantErr: "--output yaml: this command does not print that format"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			err := output.Write(&b, tc.f, tc.v)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWriteCompactJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := output.WriteCompactJSON(&b, map[string]string{"a": "<"}); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "{\"a\":\"\\u003c\"}\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestWriteError(t *testing.T) {
	t.Parallel()
	boom := errors.New("disk full")
	if err := output.Write(failWriter{boom}, output.JSON, result{}); !errors.Is(err, boom) {
		t.Errorf("error %v, want %v", err, boom)
	}
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }
