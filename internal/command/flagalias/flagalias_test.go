package flagalias_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/command/flagalias"
	"github.com/gpupass/gpupass/internal/command/flagenv"
)

// TestShorthand: the old short flag sets the same value as the new one,
// says so on the error writer only, counts as typed (the GPUPASS_*
// variable does not override it) and stays out of the help.
func TestShorthand(t *testing.T) {
	t.Parallel()
	env := map[string]string{"GPUPASS_SPEC": "from-env.yaml"}
	tests := []struct {
		name     string
		args     []string
		want     string
		wantNote bool
	}{
		{name: "new short", args: []string{"-s", "a.yaml"}, want: "a.yaml"},
		{name: "long", args: []string{"--spec=a.yaml"}, want: "a.yaml"},
		{name: "old short", args: []string{"-f", "a.yaml"}, want: "a.yaml", wantNote: true},
		{name: "old short, attached", args: []string{"-fa.yaml"}, want: "a.yaml", wantNote: true},
		{name: "nothing typed: the variable", args: nil, want: "from-env.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var spec string
			var stdout, stderr bytes.Buffer
			cmd := &cobra.Command{Use: "validate", RunE: func(cmd *cobra.Command, _ []string) error {
				return flagenv.Apply(cmd, func(k string) string { return env[k] })
			}}
			cmd.SetOut(&stdout)
			cmd.SetErr(&stderr)
			cmd.Flags().StringVarP(&spec, "spec", "s", "", "spec file")
			flagalias.Shorthand(cmd.Flags(), "spec", "f", cmd.ErrOrStderr)
			cmd.SetArgs(tt.args)
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			if spec != tt.want {
				t.Errorf("spec = %q, want %q", spec, tt.want)
			}
			const note = "warning: -f for --spec is deprecated and will be removed: use -s or --spec\n"
			if got := stderr.String(); (got == note) != tt.wantNote || (!tt.wantNote && got != "") {
				t.Errorf("stderr = %q, want the note: %v", got, tt.wantNote)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
	t.Run("help", func(t *testing.T) {
		t.Parallel()
		var spec string
		var out bytes.Buffer
		cmd := &cobra.Command{Use: "validate", Run: func(*cobra.Command, []string) {}}
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		cmd.Flags().StringVarP(&spec, "spec", "s", "", "spec file")
		flagalias.Shorthand(cmd.Flags(), "spec", "f", cmd.ErrOrStderr)
		cmd.SetArgs([]string{"--help"})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if h := out.String(); !strings.Contains(h, "-s, --spec string") || strings.Contains(h, "-f") || strings.Contains(h, "deprecated") {
			t.Errorf("help:\n%s", h)
		}
	})
}
