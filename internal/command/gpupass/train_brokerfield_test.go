package gpupass_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
)

// TestTrainRenamesTheBrokersField: the broker refuses a request field in
// its own terms (time_limit_seconds, workdir_archive); train says which of
// its flags that was, so the user sees the flag they typed and the fix.
func TestTrainRenamesTheBrokersField(t *testing.T) {
	t.Parallel()
	cfg := brokertest.Fast()
	cfg.MaxTimeLimit = time.Hour
	cfg.Workdir.MaxEntries = 2
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	broker := []string{"--broker-url", b.URL, "--broker-token", b.Token(t, store.RoleSubmit, "*")}
	spec := writeH100Spec(t)
	proj := t.TempDir()
	for _, f := range []string{"a.py", "b.py", "c.py"} {
		if err := os.WriteFile(filepath.Join(proj, f), []byte("print(1)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"a time limit over the broker's cap", []string{"train", "--spec", spec, "--region", "us-west-2", "--no-workdir", "--time-limit", "2h"},
			[]string{"--time-limit: 2h is longer than this broker allows (1h: gpupass-broker serve --max-time-limit)"}},
		{"a work dir over the broker's limit", []string{"train", "--spec", spec, "--region", "us-west-2", "--workdir", proj},
			[]string{"--workdir: refused: ", "gpupass-broker serve --workdir-max-*", "ship less (data from storage, not the work dir; a .gpupassignore leaves files out)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append(append(tc.args, broker...), "--", "python3", "train.py")
			code, out, errOut := runMain(t, args...)
			if code == 0 {
				t.Fatalf("train exit 0, want a refusal\nstdout:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("train's error lacks %q:\n%s", w, errOut)
				}
			}
			for _, bad := range []string{"time_limit_seconds", "workdir_archive"} {
				if strings.Contains(errOut, bad) {
					t.Errorf("train's error names the broker's field %s, not the flag:\n%s", bad, errOut)
				}
			}
		})
	}
}
