package flagenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestApply(t *testing.T) {
	t.Parallel()
	secretFile := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(secretFile, []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	newCmd := func() (*cobra.Command, *string, *int, *string) {
		cmd := &cobra.Command{Use: "x"}
		url := cmd.Flags().String("broker-url", "", "")
		n := cmd.Flags().Int("count", 1, "")
		tok := cmd.Flags().String("flagenv-test-token", "", "")
		MarkSecret("flagenv-test-token")
		return cmd, url, n, tok
	}
	env := map[string]string{
		"GPUPASS_BROKER_URL":              "http://127.0.0.1:7070",
		"GPUPASS_COUNT":                   "3",
		"GPUPASS_FLAGENV_TEST_TOKEN_FILE": secretFile,
	}
	cmd, url, n, tok := newCmd()
	if err := Apply(cmd, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *url != "http://127.0.0.1:7070" || *n != 3 || *tok != "s3cr3t" {
		t.Errorf("got url=%q count=%d token=%q", *url, *n, *tok)
	}

	// A flag given on the command line wins over the environment.
	cmd, url, _, _ = newCmd()
	if err := cmd.Flags().Parse([]string{"--broker-url", "http://[::1]:1"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(cmd, func(k string) string { return env[k] }); err != nil || *url != "http://[::1]:1" {
		t.Errorf("command line lost to env: %q, %v", *url, err)
	}

	// A bad value names the variable; a secret's value is never echoed.
	cmd, _, _, _ = newCmd()
	err := Apply(cmd, func(k string) string {
		return map[string]string{"GPUPASS_COUNT": "many"}[k]
	})
	if err == nil || !strings.Contains(err.Error(), "GPUPASS_COUNT") {
		t.Errorf("bad int: %v", err)
	}
	if Name("max-price") != "GPUPASS_MAX_PRICE" {
		t.Errorf("Name = %q", Name("max-price"))
	}
}

func TestTypos(t *testing.T) {
	known := map[string]bool{"GPUPASS_BROKER_URL": true, "GPUPASS_TO": true, "GPUPASS_REGION": true}
	got := Typos([]string{"GPUPASS_BROKR_URL=x", "GPUPASS_FOO=1", "GPUPASS_REGIONS=a", "GPUPASS_BROKER_URL=y", "GPUPASS_ALLOCATION_US_WEST_2=z", "OTHER_BROKR_URL=x"}, known)
	if len(got) != 1 || !strings.Contains(got[0], "GPUPASS_BROKR_URL") || !strings.Contains(got[0], "did you mean GPUPASS_BROKER_URL?") {
		t.Errorf("Typos = %q, want one warning for GPUPASS_BROKR_URL", got)
	}
}

// TestAlias: an old flag name and its variable still set the value, the
// new name wins over the old in either form, and the old one is hidden.
func TestAlias(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		flags []string
		vars  map[string]string
		want  string
	}{
		{"new flag", []string{"--flagenv-new-tok", "a"}, nil, "a"},
		{"old flag", []string{"--flagenv-old-tok", "b"}, nil, "b"},
		{"new env", nil, map[string]string{"GPUPASS_FLAGENV_NEW_TOK": "c"}, "c"},
		{"old env", nil, map[string]string{"GPUPASS_FLAGENV_OLD_TOK": "d"}, "d"},
		{"new env over old env", nil, map[string]string{"GPUPASS_FLAGENV_NEW_TOK": "e", "GPUPASS_FLAGENV_OLD_TOK": "x"}, "e"},
		{"old flag over new env", []string{"--flagenv-old-tok", "f"}, map[string]string{"GPUPASS_FLAGENV_NEW_TOK": "x"}, "f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got string
			cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
			cmd.Flags().StringVar(&got, "flagenv-new-tok", "", "")
			Alias(cmd.Flags(), "flagenv-new-tok", "flagenv-old-tok")
			cmd.SetErr(&strings.Builder{})
			if err := cmd.ParseFlags(tt.flags); err != nil {
				t.Fatal(err)
			}
			if err := Apply(cmd, func(k string) string { return tt.vars[k] }); err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("value %q, want %q", got, tt.want)
			}
			if f := cmd.Flags().Lookup("flagenv-old-tok"); !f.Hidden || f.Deprecated == "" {
				t.Errorf("old name not hidden and deprecated: %+v", f)
			}
		})
	}
}
