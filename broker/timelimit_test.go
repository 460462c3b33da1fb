package broker_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestTimeLimit: a run's wall-clock limit is the request's over the
// spec's resources.time-limit, is stored with the run (both stores: it
// lives in the allocation's JSON body), shown with it and sent to the
// node in the assignment; one over the broker's --max-time-limit is
// refused naming the field the user wrote.
func TestTimeLimit(t *testing.T) {
	t.Parallel()
	withLimit := func(limit string) []byte {
		return bytes.Replace(specYAML(t), []byte("resources:\n"), []byte("resources:\n  time-limit: "+limit+"\n"), 1)
	}
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cfg := brokertest.Fast()
			cfg.MaxTimeLimit = 2 * time.Hour
			b := brokertest.Start(t, brokertest.NewDB(t, kind), cfg)
			w := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
			w.keepAlive(t)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))

			for _, tc := range []struct {
				name    string
				spec    []byte
				seconds int64
				want    int64
			}{
				{"none", specYAML(t), 0, 0},
				{"spec", withLimit("90m"), 0, 5400},
				{"flag over spec", withLimit("90m"), 30, 30},
			} {
				run := submit(t, c, "us-west-2", func(r *gpupassv1.SubmitRequest) {
					r.SpecYaml = tc.spec
					r.TimeLimitSeconds = tc.seconds
				})
				as := w.poll(t, 5)
				if as == nil || as.AllocId != run.Id {
					t.Fatalf("%s: assignment %v, want run %s", tc.name, as, run.Id)
				}
				if run.TimeLimitSeconds != tc.want || as.TimeLimitSeconds != tc.want || getRun(t, c, run.Id).TimeLimitSeconds != tc.want {
					t.Errorf("%s: time limit submitted %d, assigned %d, stored %d; want %d", tc.name, run.TimeLimitSeconds, as.TimeLimitSeconds,
						getRun(t, c, run.Id).TimeLimitSeconds, tc.want)
				}
				for _, st := range []gpupassv1.AllocState{gpupassv1.AllocState_ALLOC_STATE_RUNNING, gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED} {
					if _, err := w.update(as, st, "done", 0); err != nil {
						t.Fatal(err)
					}
				}
			}

			for _, tc := range []struct {
				name    string
				spec    []byte
				seconds int64
				want    []string
			}{
				{"flag over the cap", specYAML(t), 3 * 3600, []string{"time_limit_seconds: 3h", "--max-time-limit", "2h"}},
				{"spec over the cap", withLimit("3h"), 0, []string{"the spec's resources.time-limit", "3h", "--max-time-limit"}},
				{"flag over any cap", specYAML(t), 1 << 62, []string{"time_limit_seconds", "--max-time-limit"}},
				{"negative", specYAML(t), -5, []string{"time_limit_seconds", "positive"}},
			} {
				_, err := c.Run.Submit(context.Background(), connect.NewRequest(&gpupassv1.SubmitRequest{
					SpecYaml: tc.spec, Region: "us-west-2", Command: []string{"true"}, TimeLimitSeconds: tc.seconds}))
				if connect.CodeOf(err) != connect.CodeInvalidArgument {
					t.Errorf("%s: %v, want invalid_argument", tc.name, err)
					continue
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %v, want it to say %q", tc.name, err, w)
					}
				}
			}
		})
	}
}
