package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestOutputFlag: gpupass-broker's -o json prints JSON that parses (the
// token once, on create; never on list), and a format it does not print
// is refused before the store is opened, naming the flag, its variable
// and the accepted values; the shell completes the values (issue #33,
// item 4).
func TestOutputFlag(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	t.Run("json parses", func(t *testing.T) {
		t.Parallel()
		db := "sqlite://" + filepath.Join(t.TempDir(), "broker.db")
		code, out, errOut := run("-o", "json", "token", "create", "--db", db, "--role", "read", "--regions", "*")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var created tokenJSON
		if err := json.Unmarshal([]byte(out), &created); err != nil || created.Token == "" || created.Role != "read" {
			t.Fatalf("not token create's JSON (%v): %q", err, out)
		}
		code, out, errOut = run("token", "list", "--db", db, "-o", "json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var list []tokenJSON
		if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].ID != created.ID || list[0].Token != "" {
			t.Fatalf("not token list's JSON, or it holds the secret (%v): %q", err, out)
		}
	})
	t.Run("yaml is refused", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "broker.db")
		code, out, errOut := run("-o", "yaml", "token", "list", "--db", "sqlite://"+path)
		want := `gpupass-broker: --output "yaml" (or GPUPASS_OUTPUT): must be text or json` + "\n"
		if code != 2 || out != "" || errOut != want {
			t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, stderr %q", code, out, errOut, want)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("the store was opened before the refusal: %s exists", path)
		}
	})
	t.Run("completion", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := run("__completeNoDesc", "token", "list", "-o", "")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if diff := cmp.Diff("text\njson\n:4\n", out); diff != "" {
			t.Errorf("gpupass-broker token list -o <TAB> (-want +got):\n%s", diff)
		}
	})
}
