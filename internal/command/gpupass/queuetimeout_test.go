package gpupass_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/runview"
)

// TestTrainQueueTimeoutPrecedence (issue #35): the run's queue timeout is
// --queue-timeout, else GPUPASS_QUEUE_TIMEOUT (the Action's and the
// component's queue-timeout input), else the spec's
// resources.queue-timeout, else none; nonsense is refused naming the flag,
// its variable and the bound. It sets environment variables, so it does
// not run in parallel.
func TestTrainQueueTimeoutPrecedence(t *testing.T) {
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	broker := []string{"--broker-url", b.URL, "--broker-token", b.Token(t, store.RoleSubmit, "*")}
	plain := writeH100Spec(t)
	withTimeout := writeH100Spec(t)
	data, err := os.ReadFile(withTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(withTimeout, []byte(strings.Replace(string(data), "resources:\n", "resources:\n  queue-timeout: 10m\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, spec, env string
		flag            []string
		want            int64
		wantErr         string
	}{
		{name: "none", spec: plain, want: 0},
		{name: "the spec's", spec: withTimeout, want: 600},
		{name: "the variable over the spec", spec: withTimeout, env: "5m", want: 300},
		{name: "the flag over the variable and the spec", spec: withTimeout, env: "5m", flag: []string{"--queue-timeout", "2m"}, want: 120},
		{name: "negative", spec: plain, flag: []string{"--queue-timeout", "-10m"},
			wantErr: `--queue-timeout "-10m": "-10m" is not positive; a queue timeout must be at least 1s`},
		{name: "past the bound from the variable", spec: plain, env: "200h",
			wantErr: `--queue-timeout "200h": "200h" is longer than 168h, the most a queue timeout may be`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GPUPASS_QUEUE_TIMEOUT", tc.env)
			args := append(append(append([]string{"-o", "json", "train", "--spec", tc.spec, "--region", "us-west-2", "--no-workdir"}, tc.flag...), broker...), "--", "python3", "train.py")
			code, out, errOut := runMain(t, args...)
			if tc.wantErr != "" {
				if code == 0 || !strings.Contains(errOut, tc.wantErr) {
					t.Fatalf("train exit %d, stderr:\n%s\nwant a refusal with %q", code, errOut, tc.wantErr)
				}
				return
			}
			var l runview.List
			if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Runs) != 1 {
				t.Fatalf("train exit %d: %v; stdout:\n%s\nstderr:\n%s", code, err, out, errOut)
			}
			if got := l.Runs[0].QueueTimeoutSeconds; got != tc.want {
				t.Errorf("queue_timeout_seconds = %d, want %d", got, tc.want)
			}
		})
	}
}
