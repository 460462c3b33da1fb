package agent

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// TestRunLedgerKeepsTheGang: a gang's rank recorded as its command
// starts is followed on, after the agent restarted, with the rendezvous
// it started with (a Slurm gang's executor finds the one job again as
// that rank's, and never takes the rank for a run on one node).
func TestRunLedgerKeepsTheGang(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l := &RunLoop{StateDir: dir, JobPortMin: 29500, JobPortMax: 29599}
	a := &Assignment{AllocID: "alloc-0000ab12-r1", FencingToken: 3, Command: []string{"python3", "train_ddp.py"},
		Gang:    &rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 1, MasterAddr: "10.0.0.7", MasterPort: 29507},
		GangRun: "alloc-0000ab12"}
	e, b, started := recordedJob(t, l, a)
	again := e.assignment()
	if again.Gang == nil || again.GangRun != a.GangRun {
		t.Fatalf("the rank followed on after a restart has gang %+v of run %q, want %+v of %q: its ledger %s", again.Gang, again.GangRun, a.Gang, a.GangRun, b)
	}
	env, err := l.gangEnv(again)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(started, env); diff != "" {
		t.Errorf("the rendezvous followed on differs from the one the rank started with (-started +followed):\n%s", diff)
	}
}

// recordedJob is the ledger of a's run once runtime-init recorded its job
// (as the lease check does), read back as a restarted agent reads it,
// with its bytes and the rendezvous the rank started with.
func recordedJob(t *testing.T, l *RunLoop, a *Assignment) (runLedger, []byte, []string) {
	t.Helper()
	started, err := l.gangEnv(a)
	if err != nil {
		t.Fatal(err)
	}
	r := &run{l: l, a: a, ledgerWritten: func() error { return nil }}
	if err := r.recordJob(executor.Job{AllocID: a.AllocID, Command: a.Command, Rendezvous: started}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(l.ledgerPath(a.AllocID))
	if err != nil {
		t.Fatal(err)
	}
	var e runLedger
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	return e, b, started
}
