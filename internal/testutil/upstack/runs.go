package upstack

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	brokerclient "github.com/gpupass/gpupass/internal/client"
)

// RunLog reads a run's whole log, metric records included, and returns
// its records' data, one a line, and how many there are; a gap or a
// repeat in their sequence numbers fails the test.
func RunLog(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, id string) (text string, n uint64) {
	t.Helper()
	ls, err := rc.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: id, IncludeMetrics: true}))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for ls.Receive() {
		for _, rec := range ls.Msg().Records {
			n++
			if rec.Seq != n {
				t.Fatalf("%s: record %d has seq %d (gap or repeat)", id, n, rec.Seq)
			}
			b.Write(rec.Data)
			b.WriteByte('\n')
		}
	}
	if err := ls.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String(), n
}

// CheckFollowedOn checks a run of examples/train (--checkpoint-every 1)
// whose agent was killed and restarted under it: every step's checkpoint
// line and metric point is there once, none lost or repeated across the
// restart, and the log says the run was followed on.
func CheckFollowedOn(t testing.TB, ctx context.Context, rc *brokerclient.RunClients, id string, steps int) {
	t.Helper()
	l, _ := RunLog(t, ctx, rc, id)
	for step := 1; step <= steps; step++ {
		// The trainer's line, not the shipped checkpoint's records.
		if n := strings.Count(l, fmt.Sprintf("/ckpt-%08d.pt\"}", step)); n != 1 {
			t.Errorf("the line of checkpoint %d is in the log %d times, want once (lost or duplicated across the restart)", step, n)
		}
	}
	if !strings.Contains(l, "the agent restarted; following attempt 1 on") {
		t.Errorf("the log does not say the run was followed on")
	}
	mr, err := rc.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
	if err != nil {
		t.Fatal(err)
	}
	count := map[int64]int{}
	for _, p := range mr.Msg.Points {
		count[p.Step]++
	}
	for step := int64(1); step <= int64(steps); step++ {
		if count[step] != 1 {
			t.Errorf("metric point of step %d is there %d times, want once", step, count[step])
		}
	}
}
