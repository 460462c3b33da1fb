package broker_test

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestBadInputIsInvalidArgument: a NaN threshold or an infinite budget
// once passed Submit's checks and failed in the store (the run's limits
// are JSON, which has neither), and a record with empty data hit NOT
// NULL: both answered "unavailable", logged an ERROR, and the agent
// retried the same batch for ever. They are the caller's mistakes.
func TestBadInputIsInvalidArgument(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var logs syncBuffer
			cfg := brokertest.Fast()
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			b := brokertest.Start(t, brokertest.NewDB(t, kind), cfg)
			w := newWorker(t, b, b.Token(t, store.RoleAgent, "*"), brokertest.H100("us-west-2", 20))
			w.keepAlive(t)
			c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
			nan, inf := math.NaN(), math.Inf(1)
			for _, tc := range []struct {
				field string
				mod   func(*gpupassv1.SubmitRequest)
			}{
				{"min_health_score", func(r *gpupassv1.SubmitRequest) { r.MinHealthScore = &nan }},
				{"min_health_score", func(r *gpupassv1.SubmitRequest) { r.MinHealthScore = &inf }},
				{"max_price", func(r *gpupassv1.SubmitRequest) { r.MaxPrice = inf }},
				{"max_price", func(r *gpupassv1.SubmitRequest) { r.MaxPrice = nan }},
			} {
				req := &gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-west-2", Command: []string{"python3", "train.py"}}
				tc.mod(req)
				_, err := c.Run.Submit(ctx, connect.NewRequest(req))
				if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) {
					t.Errorf("Submit with %s %v/%v: %v, want invalid_argument naming it", tc.field, req.GetMinHealthScore(), req.MaxPrice, err)
				}
			}
			_, err := b.Clients(t, b.Token(t, store.RoleRead, "*")).Node.DryRun(ctx, connect.NewRequest(&gpupassv1.DryRunRequest{
				Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: specYAML(t)}, MinHealthScore: &nan}))
			if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "min_health_score") {
				t.Errorf("DryRun with min_health_score NaN: %v, want invalid_argument naming it", err)
			}

			run := submit(t, c, "us-west-2", nil)
			as := w.poll(t, 5)
			if as == nil || as.AllocId != run.Id {
				t.Fatalf("assignment = %v, want %s", as, run.Id)
			}
			recs := records(1, 2)
			recs[1].Data = nil
			if _, err := w.upload(as, recs); brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "records[1] (seq 2") {
				t.Errorf("record with empty data: %v, want invalid_argument naming records[1]", err)
			}
			if held, err := w.upload(as, records(1, 2)); err != nil || held != 2 {
				t.Errorf("the batch sent again, fixed: held %d, %v; want 2", held, err)
			}
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("bad input logged an error:\n%s", logs.String())
			}
		})
	}
}
