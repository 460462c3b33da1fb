package gpupass_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestOutputFlag: -o json prints one JSON document that parses, and a
// format gpupass does not print is refused before the command does
// anything, naming the flag, where else it may have come from and the
// accepted values; the shell completes the values (issue #33, item 4).
func TestOutputFlag(t *testing.T) {
	t.Parallel()
	t.Run("json parses", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "proj")
		code, out, errOut := runMain(t, "-o", "json", "init", dir)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var got struct {
			Dir   string   `json:"dir"`
			Files []string `json:"files"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || got.Dir != dir || len(got.Files) == 0 {
			t.Fatalf("not init's JSON document (%v): %q", err, out)
		}
	})
	for _, args := range [][]string{{"-o", "yaml", "init", "DIR"}, {"init", "DIR", "--output", "yaml"}, {"-o", "github", "init", "DIR"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "proj")
			for i, a := range args {
				if a == "DIR" {
					args[i] = dir
				}
			}
			code, out, errOut := runMain(t, args...)
			want := `gpupass: --output "yaml" (or GPUPASS_OUTPUT): must be text or json` + "\n"
			if args[1] == "github" {
				want = "gpupass: --output github: gpupass init prints text or json\n"
			}
			if code != 2 || out != "" || errOut != want {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, stderr %q", code, out, errOut, want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("init ran before the refusal: %s exists", dir)
			}
		})
	}
	t.Run("completion", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := runMain(t, "__completeNoDesc", "runs", "-o", "")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if diff := cmp.Diff("text\njson\n:4\n", out); diff != "" {
			t.Errorf("gpupass runs -o <TAB> (-want +got):\n%s", diff)
		}
	})
}
