package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	daemon "github.com/gpupass/gpupass/agent"
)

// TestOutputFlag: gpupass-agent's -o is the root's flag, as on the other
// binaries: given before check, -o json prints the signed report that
// parses; a format the agent does not print is refused before the suite
// runs or a key is made, naming the flag, its variable and the accepted
// values; the shell completes the values (issue #33, item 4).
func TestOutputFlag(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	t.Run("json parses", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := run("-o", "json", "check", "--state-dir", t.TempDir(), "--read-probe-mb", "1", "--simulate", "rtx-4090-1x")
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var got struct {
			Report    json.RawMessage `json:"report"`
			Signature string          `json:"signature"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || got.Signature == "" {
			t.Fatalf("not the signed report (%v): %q", err, out)
		}
	})
	for _, args := range [][]string{{"-o", "yaml", "check"}, {"check", "--output", "yaml"}, {"-o", "yaml"}} {
		t.Run(args[len(args)-1]+" "+args[0], func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			code, out, errOut := run(append(args, "--state-dir", dir, "--simulate", "rtx-4090-1x")...)
			want := `gpupass-agent: --output "yaml" (or GPUPASS_OUTPUT): must be text or json` + "\n"
			if code != ExitUsage || out != "" || errOut != want {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, stderr %q", code, out, errOut, ExitUsage, want)
			}
			if _, err := os.Stat(filepath.Join(dir, daemon.PublicKeyFile)); !os.IsNotExist(err) {
				t.Errorf("the agent made its key before the refusal")
			}
		})
	}
	t.Run("completion", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := run("__completeNoDesc", "check", "-o", "")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if diff := cmp.Diff("text\njson\n:4\n", out); diff != "" {
			t.Errorf("gpupass-agent check -o <TAB> (-want +got):\n%s", diff)
		}
	})
}
