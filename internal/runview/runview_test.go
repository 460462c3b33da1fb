package runview_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/runview"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json")

func runs() []*gpupassv1.Run {
	at := time.Date(2026, 12, 2, 3, 51, 59, 123456789, time.UTC).UnixNano()
	return []*gpupassv1.Run{
		{
			Id: "alloc-8a3f9b21", Name: "bert-us-0123456", Region: "us-west-2", State: gpupassv1.AllocState_ALLOC_STATE_FAILED,
			Reason: "exited with status 2", NodeId: "node-a",
			Score: &gpupassv1.HealthScore{Score: 91.5, LatencyMs: 12, LatencyUsedMs: 12, LatencyCapMs: 50, LatencyPenalty: 1.2,
				FailureRatePct: 1.5, Launches_24H: 40, LaunchFailures_24H: 1, FailurePenalty: 7.5, ClassMeanPrice: 2.5,
				PricePremiumPct: -4, PricePenalty: -8},
			PricePerHour: 2.4, MaxPrice: 30, SpecFingerprint: "sha256:0f", Command: []string{"python3", "train.py"},
			ExitCode: 2, Attempts: 2, Restarts: 1, CancelRequested: false, Simulated: true, ResumeElsewhere: true,
			ReplacedNodes: []string{"node-z"}, TimeLimitSeconds: 5400, HeldThrough: 9007199254740993, LastSeq: 9007199254740993,
			LogDisputed: true, DisputedRecords: 3, FirstDisputedSeq: 17, LogComplete: false,
			CreatedUnixNano: at, UpdatedUnixNano: at + 1e9, StartedUnixNano: at + 2e9, FinishedUnixNano: at + 3e9,
			Slurm: &gpupassv1.SlurmPlacement{Cluster: "hpc1", JobId: "4021", Node: "gpu-n17", Partition: "a100"},
		},
		// Just submitted: no node, score, command or times past creation.
		{Id: "alloc-1c2d3e4f", Region: "eu-central-1", State: gpupassv1.AllocState_ALLOC_STATE_PENDING, CreatedUnixNano: at},
		// Waiting in its region's queue for a busy node.
		{Id: "alloc-5a6b7c8d", Region: "us-west-2", State: gpupassv1.AllocState_ALLOC_STATE_PENDING, Reason: "waiting for a free node",
			CreatedUnixNano: at, QueuePosition: 2, QueuedUnixNano: at + 1e9, QueueNodes: 3, QueueTimeoutSeconds: 600},
	}
}

// TestGolden holds the documented shape: every key, its spelling and its
// type. A change here is a change to a public contract (docs/using.md "Runs as
// JSON"): add keys, never rename or retype one.
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"list", func(b *bytes.Buffer) error { return runview.WriteList(b, runs()) }},
		{"run", func(b *bytes.Buffer) error { return runview.WriteRun(b, runs()[0]) }},
		{"empty", func(b *bytes.Buffer) error { return runview.WriteList(b, nil) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got bytes.Buffer
			if err := tt.write(&got); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tt.name+".golden.json")
			if *update {
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), got.String()); diff != "" {
				t.Errorf("%s (-want +got; run with -update if the change is meant):\n%s", golden, diff)
			}
		})
	}
}

// TestTypes checks what jq users rely on, independent of the golden file:
// numbers are numbers (also past 2^53 for sequence numbers, which Go
// decodes exactly into uint64), times parse as RFC 3339, states are lower
// case, and a run not yet placed has null times and score but [] lists.
func TestTypes(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := runview.WriteList(&b, runs()); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Runs []map[string]any `json:"runs"`
	}
	dec := json.NewDecoder(bytes.NewReader(b.Bytes()))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		t.Fatal(err)
	}
	failed, pending := raw.Runs[0], raw.Runs[1]
	if failed["state"] != "failed" || pending["state"] != "pending" {
		t.Errorf("states %v, %v", failed["state"], pending["state"])
	}
	for _, k := range []string{"exit_code", "attempts", "price_per_hour"} {
		if _, ok := failed[k].(json.Number); !ok {
			t.Errorf("%s = %#v, want a JSON number", k, failed[k])
		}
	}
	if n := failed["log"].(map[string]any)["held_through"]; n != json.Number("9007199254740993") {
		t.Errorf("log.held_through = %#v, want the number 9007199254740993", n)
	}
	for _, k := range []string{"created_at", "updated_at", "started_at", "finished_at"} {
		s, _ := failed[k].(string)
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
			t.Errorf("%s = %#v: %v", k, failed[k], err)
		}
	}
	if failed["created_at"] != "2026-12-02T03:51:59.123456789Z" {
		t.Errorf("created_at = %v", failed["created_at"])
	}
	for _, k := range []string{"started_at", "finished_at", "score"} {
		if v, ok := pending[k]; !ok || v != nil {
			t.Errorf("pending run: %s = %#v (present %v), want null", k, v, ok)
		}
	}
	for _, k := range []string{"command", "replaced_nodes"} {
		if v, ok := pending[k].([]any); !ok || len(v) != 0 {
			t.Errorf("pending run: %s = %#v, want []", k, pending[k])
		}
	}
}
