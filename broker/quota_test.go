package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// TestRunQuota: an agent that uploads without end (a broken one, or one
// whose own limits are off) is stopped by the broker's per-run quota:
// over the records or bytes limit the upload is refused and the run is
// failed with the reason; over the rate the upload is told to retry. The
// bytes are read from the store, so on PostgreSQL two replicas taking
// the run's uploads in turn enforce one limit between them. Another
// run's uploads go on.
func TestRunQuota(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		for _, tc := range []struct {
			name     string
			cfg      func(*brokertestConfig)
			wantCode connect.Code
			wantMsg  string
		}{
			{"log bytes", func(c *brokertestConfig) { c.RunMaxLogBytes = 3000 }, connect.CodeResourceExhausted, "--run-max-log-mb"},
			{"records", func(c *brokertestConfig) { c.RunMaxRecords = 25 }, connect.CodeResourceExhausted, "--run-max-records"},
			{"rate", func(c *brokertestConfig) { c.RunMaxRecordsPerSecond = 10 }, connect.CodeUnavailable, "--run-max-records-per-second"},
		} {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				cfg := brokertest.Fast()
				cfg.RunMaxRecords, cfg.RunMaxLogBytes, cfg.RunMaxRecordsPerSecond = -1, -1, -1
				tc.cfg(&cfg)
				db := brokertest.NewDB(t, kind)
				b1 := brokertest.Start(t, db, cfg)
				b2 := b1
				if kind == "postgres" {
					b2 = brokertest.Start(t, db, cfg) // a second replica
				}
				agentTok := b1.Token(t, store.RoleAgent, "*")
				c := dialRuns(t, b1, b1.Token(t, store.RoleSubmit, "*"))
				chatty := newWorker(t, b1, agentTok, brokertest.H100("us-west-2", 20))
				quiet := newWorker(t, b1, agentTok, brokertest.H100("us-west-2", 20.5))
				chatty.keepAlive(t)
				quiet.keepAlive(t)
				via2 := &worker{Agent: chatty.Agent}
				var err error
				if via2.runs, err = client.DialRuns(b2.URL, client.Options{Token: agentTok, GRPC: true, Agent: chatty.Creds}); err != nil {
					t.Fatal(err)
				}
				run := submit(t, c, "us-west-2", nil)
				as := chatty.poll(t, 5)
				other := submit(t, c, "us-west-2", nil)
				oas := quiet.poll(t, 5)
				if as == nil || oas == nil || as.AllocId != run.Id || oas.AllocId != other.Id {
					t.Fatalf("assignments: %v, %v", as, oas)
				}
				for _, w := range []struct {
					w  *worker
					as *gpupassv1.Assignment
				}{{chatty, as}, {quiet, oas}} {
					if _, err := w.w.update(w.as, gpupassv1.AllocState_ALLOC_STATE_RUNNING, "", 0); err != nil {
						t.Fatal(err)
					}
				}

				// Batches of 10 records (about 90 bytes each), through
				// the two replicas in turn, until one is refused.
				var refused error
				seq := uint64(1)
				for i := 0; i < 100 && refused == nil; i++ {
					w := chatty
					if i%2 == 1 {
						w = via2
					}
					if _, err := w.upload(as, records(seq, seq+9)); err != nil {
						refused = err
						break
					}
					seq += 10
				}
				if refused == nil {
					t.Fatalf("1000 records were all taken: no limit applied")
				}
				if connect.CodeOf(refused) != tc.wantCode || !strings.Contains(refused.Error(), tc.wantMsg) {
					t.Fatalf("refusal at seq %d = %v; want %v naming %s", seq, refused, tc.wantCode, tc.wantMsg)
				}
				t.Logf("refused at seq %d: %v", seq, refused)

				// The other run is not affected.
				if held, err := quiet.upload(oas, records(1, 20)); err != nil || held != 20 {
					t.Errorf("the other run's upload = %d, %v; want 20, nil", held, err)
				}
				st := getRun(t, c, run.Id)
				switch tc.wantCode {
				case connect.CodeResourceExhausted:
					if st.State != gpupassv1.AllocState_ALLOC_STATE_FAILED || !strings.Contains(st.Reason, "quota: ") || !strings.Contains(st.Reason, tc.wantMsg) {
						t.Errorf("run over quota: %v %q; want FAILED with a quota reason naming %s", st.State, st.Reason, tc.wantMsg)
					}
					if lu, ok := b1.Store.(store.LogUsage); ok && cfg.RunMaxLogBytes > 0 {
						if n, _, err := lu.LogBytes(context.Background(), run.Id, 0, 0); err != nil || n > cfg.RunMaxLogBytes {
							t.Errorf("stored log: %d bytes (%v); limit %d", n, err, cfg.RunMaxLogBytes)
						}
					}
				case connect.CodeUnavailable:
					// Back-pressure, not loss: the same batch is taken once
					// the rate allows (bounded wait).
					var err error = refused
					for i := 0; i < 100 && err != nil; i++ {
						time.Sleep(50 * time.Millisecond)
						_, err = chatty.upload(as, records(seq, seq+9))
					}
					if err != nil {
						t.Errorf("the batch refused for rate was never taken: %v", err)
					}
					if st.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING {
						t.Errorf("run over rate: %v %q; want it still running", st.State, st.Reason)
					}
				}
			})
		}
	}
}

type brokertestConfig = broker.Config
