package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// TestSubmitRefusalsNameNoClientFlag: the broker cannot know which client
// sent a Submit (gpupass train by hand or as a CI step, a Go program), so a
// refusal names the request field, in the error's text and in a detail
// the client renames to its own flag or input, and only the broker's own
// operator flags; it used to tell every caller `gpupass train --workdir`.
func TestSubmitRefusalsNameNoClientFlag(t *testing.T) {
	t.Parallel()
	cfg := brokertest.Fast()
	cfg.MaxTimeLimit = time.Hour
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), cfg)
	c := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
	for _, tc := range []struct {
		name, field, want string
		mod               func(*gpupassv1.SubmitRequest)
	}{
		{"no command", api.FieldSubmitCommand, "command is required", func(r *gpupassv1.SubmitRequest) { r.Command = nil }},
		{"a bad name", api.FieldSubmitName, `name: run name "a b"`, func(r *gpupassv1.SubmitRequest) { r.Name = "a b" }},
		{"a workdir archive over a limit", api.FieldSubmitWorkdir, "workdir_archive: refused: ", func(r *gpupassv1.SubmitRequest) {
			r.WorkdirArchive = tarGz(t, 1, func(int) (string, int64) { return strings.Repeat("d/", 40) + "x", 1 })
		}},
		{"a time limit over the cap", api.FieldSubmitTimeLimit, "time_limit_seconds: 2h is longer than this broker allows (1h: gpupass-broker serve --max-time-limit)",
			func(r *gpupassv1.SubmitRequest) { r.TimeLimitSeconds = 7200 }},
		{"a negative time limit", api.FieldSubmitTimeLimit, "time_limit_seconds is -5", func(r *gpupassv1.SubmitRequest) { r.TimeLimitSeconds = -5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := &gpupassv1.SubmitRequest{SpecYaml: specYAML(t), Region: "us-west-2",
				Command: []string{"python3", "train.py"}}
			tc.mod(req)
			_, err := c.Run.Submit(context.Background(), connect.NewRequest(req))
			if brokertest.Code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Submit: %v; want invalid_argument saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "gpupass train") || strings.Contains(err.Error(), "--name") || strings.Contains(err.Error(), "--time-limit") {
				t.Errorf("Submit's refusal names a client's flag: %v", err)
			}
			if fe := api.FieldErrorOf(err); fe == nil || fe.Field != tc.field {
				t.Errorf("Submit's refusal carries field %+v, want %q", fe, tc.field)
			}
		})
	}
}
