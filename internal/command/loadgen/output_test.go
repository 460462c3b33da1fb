package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
)

// TestOutputFlag: gpupass-loadgen's -o json prints its measurements as
// JSON that parses, and a format it does not print is refused before any
// broker is called, naming the flag, its variable and the accepted
// values; the shell completes the values (issue #33, item 4).
func TestOutputFlag(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	args := []string{"--brokers", b.URL, "--agent-token", b.Token(t, store.RoleAgent, "*"), "--agents", "2", "--runs", "0", "--submitters", "0",
		"--duration", "300ms", "--heartbeat-every", "100ms"}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	t.Run("json parses", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := run(append([]string{"-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var got struct {
			Agents int `json:"agents"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || got.Agents != 2 {
			t.Fatalf("not loadgen's JSON (%v): %q", err, out)
		}
	})
	t.Run("yaml is refused", func(t *testing.T) {
		t.Parallel()
		// A closed port: a call would fail otherwise, after the load.
		code, out, errOut := run("-o", "yaml", "--brokers", "http://127.0.0.1:1", "--agent-token", "x", "--runs", "0", "--submitters", "0")
		want := `gpupass-loadgen: --output "yaml" (or GPUPASS_OUTPUT): must be text or json` + "\n"
		if code != 2 || out != "" || errOut != want {
			t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, stderr %q", code, out, errOut, want)
		}
	})
	t.Run("completion", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := run("__completeNoDesc", "-o", "")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if diff := cmp.Diff("text\njson\n:4\n", out); diff != "" {
			t.Errorf("gpupass-loadgen -o <TAB> (-want +got):\n%s", diff)
		}
	})
}
