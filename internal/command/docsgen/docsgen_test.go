package docsgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/command/flagenv"
)

// tree is a small binary with what the reference must show and hide: a
// persistent flag, a secret, a hidden flag, an old flag name kept as an
// alias, a hidden command and a nested one.
func tree() []Tree {
	root := &cobra.Command{Use: "tool", Short: "a tool", Version: "v1.2.3",
		Long: "Every flag can be set with GPUPASS_<FLAG>; `pip install <pkg>` stays code."}
	root.PersistentFlags().StringP("output", "o", "text", "output format")
	run := &cobra.Command{Use: "run", Short: "run it", RunE: func(*cobra.Command, []string) error { return nil }}
	run.Flags().String("docsgen-token", "", "the token")
	flagenv.MarkSecret("docsgen-token")
	run.Flags().String("listen", "127.0.0.1:1", "address")
	run.Flags().String("internal-knob", "", "not for users")
	_ = run.Flags().MarkHidden("internal-knob")
	flagenv.Alias(run.Flags(), "listen", "old-listen")
	sub := &cobra.Command{Use: "deep", Short: "nested", RunE: func(*cobra.Command, []string) error { return nil }}
	run.AddCommand(sub)
	secret := &cobra.Command{Use: "secret", Short: "hidden", Hidden: true, RunE: func(*cobra.Command, []string) error { return nil }}
	root.AddCommand(run, secret)
	return []Tree{{Command: root, Note: "It is a tool."}}
}

func TestRender(t *testing.T) {
	t.Parallel()
	pages, err := Render(tree())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"README.md", "tool.md",
		// cobra adds completion when the binary runs: it is documented.
		"tool_completion.md", "tool_completion_bash.md", "tool_completion_fish.md", "tool_completion_powershell.md", "tool_completion_zsh.md",
		"tool_run.md", "tool_run_deep.md"}, sortedKeys(pages)); diff != "" {
		t.Errorf("pages (-want +got):\n%s", diff)
	}
	run := string(pages["tool_run.md"])
	for _, want := range []string{
		header,
		"the token (env GPUPASS_DOCSGEN_TOKEN or GPUPASS_DOCSGEN_TOKEN_FILE)",
		`address (env GPUPASS_LISTEN) (default "127.0.0.1:1")`,
		// Inherited: named once, though every command holds the flag.
		`output format (env GPUPASS_OUTPUT) (default "text")`,
		"[tool run deep](tool_run_deep.md)",
	} {
		if !strings.Contains(run, want) {
			t.Errorf("tool_run.md lacks %q:\n%s", want, run)
		}
	}
	for _, hidden := range []string{"internal-knob", "old-listen", "GPUPASS_HELP", "Auto generated"} {
		for name, p := range pages {
			if strings.Contains(string(p), hidden) {
				t.Errorf("%s shows %q:\n%s", name, hidden, p)
			}
		}
	}
	// An HTML tag to a Markdown renderer, which would drop it.
	if want := "GPUPASS_&lt;FLAG>; `pip install <pkg>` stays code."; !strings.Contains(string(pages["tool.md"]), want) {
		t.Errorf("tool.md lacks %q:\n%s", want, pages["tool.md"])
	}
	if !strings.Contains(string(pages["tool.md"]), "--version") {
		t.Errorf("tool.md does not document --version:\n%s", pages["tool.md"])
	}
	if strings.Contains(string(pages["tool.md"]), "secret") {
		t.Errorf("tool.md links the hidden command:\n%s", pages["tool.md"])
	}
	index := string(pages["README.md"])
	if !strings.Contains(index, "## [tool](tool.md)\n\na tool\n\nIt is a tool.") {
		t.Errorf("README.md lacks the binary's entry:\n%s", index)
	}
}

// TestRenderTwice: rendering a tree again (make docs, then the check, in
// one process) names each variable once, and the output does not change.
func TestRenderTwice(t *testing.T) {
	t.Parallel()
	trees := tree()
	first, err := Render(trees)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Render(trees)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("second render differs (-first +second):\n%s", diff)
	}
	if n := strings.Count(string(first["tool_run.md"]), "(env GPUPASS_LISTEN)"); n != 1 {
		t.Errorf("GPUPASS_LISTEN named %d times, want once:\n%s", n, first["tool_run.md"])
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		want   string // "" for a current reference
	}{
		{"current", func(*testing.T, string) {}, ""},
		{"edited by hand", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "tool_run.md")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(strings.Replace(string(b), "the token", "a token", 1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "tool_run.md differs at line"},
		{"a command's page removed", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "tool_run_deep.md")); err != nil {
				t.Fatal(err)
			}
		}, "tool_run_deep.md is missing"},
		{"a page of a command that is gone", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "tool_old.md"), []byte(header+"## tool old\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "tool_old.md documents no command"},
		{"a page written by hand", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "notes.md"), []byte("# Notes\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "notes.md was not generated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := Write(dir, tree()); err != nil {
				t.Fatal(err)
			}
			tc.change(t, dir)
			err := Check(dir, tree())
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), Stale+":") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want %q naming %q", err, Stale, tc.want)
			}
		})
	}
}

// TestWriteRemovesStalePages: make docs after a command is removed leaves
// no page for it, and a page it did not write (the generator pointed at
// docs/ instead of docs/cli) is left alone.
func TestWriteRemovesStalePages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stale := filepath.Join(dir, "tool_old.md")
	if err := os.WriteFile(stale, []byte(header+"## tool old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	handWritten := filepath.Join(dir, "slurm.md")
	if err := os.WriteFile(handWritten, []byte("# Slurm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, tree()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("Write kept %s (stat: %v)", stale, err)
	}
	if _, err := os.Stat(handWritten); err != nil {
		t.Errorf("Write removed a page it did not write: %v", err)
	}
	if err := os.Remove(handWritten); err != nil {
		t.Fatal(err)
	}
	if err := Check(dir, tree()); err != nil {
		t.Errorf("Check after Write: %v", err)
	}
}
