package executor_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/events"
)

// run executes a job on a real spool and returns the result with every
// event and metric point read back from the spool.
type runOut struct {
	res     executor.Result
	events  []events.Event
	metrics []events.Metric
	seqs    []uint64
	// stdoutRecords counts event records of component stdout, when
	// decoding was skipped.
	stdoutRecords int
}

func execute(t *testing.T, ctx context.Context, job executor.Job, x *executor.Executor) runOut {
	t.Helper()
	return executeOpt(t, ctx, job, x, true)
}

// executeOpt with decode=false only checks the sequence and counts
// stdout events, for floods where decoding 100 MB of JSON under -race
// would dominate the test.
func executeOpt(t *testing.T, ctx context.Context, job executor.Job, x *executor.Executor, decode bool) runOut {
	t.Helper()
	if job.WorkRoot == "" {
		job.WorkRoot = t.TempDir()
	}
	if job.AllocID == "" {
		job.AllocID = "alloc-0000test"
	}
	if x == nil {
		x = &executor.Executor{}
	}
	if x.Runner == nil {
		x.Runner = local.ProcessRunner{}
	}
	if x.Host == nil {
		// What every Executor had before it had a RunHost.
		x.Host = &local.Host{}
	}
	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"), spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	res, err := x.Execute(ctx, job, sp)
	if err != nil {
		t.Fatal(err)
	}
	out := runOut{res: res}
	after := uint64(0)
	for {
		recs, err := sp.Pending(after, 100000)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			out.seqs = append(out.seqs, r.Seq)
			after = r.Seq
			if !decode {
				if r.Kind == spool.KindEvent && bytes.Contains(r.Data, []byte(`"component":"stdout"`)) {
					out.stdoutRecords++
				}
				continue
			}
			switch r.Kind {
			case spool.KindEvent:
				e, err := executor.DecodeEvent(r)
				if err != nil {
					t.Fatal(err)
				}
				out.events = append(out.events, e)
			case spool.KindMetric:
				m, err := executor.DecodeMetric(r)
				if err != nil {
					t.Fatal(err)
				}
				out.metrics = append(out.metrics, m)
			}
		}
	}
	for i, s := range out.seqs {
		if s != uint64(i+1) {
			t.Fatalf("record %d has seq %d: the sequence has a gap", i, s)
		}
	}
	if res.LastSeq != uint64(len(out.seqs)) {
		t.Errorf("result says last seq %d, spool holds %d records", res.LastSeq, len(out.seqs))
	}
	return out
}

// find returns the events of a component.
func (o runOut) find(component string) []events.Event {
	var out []events.Event
	for _, e := range o.events {
		if e.Component == component {
			out = append(out, e)
		}
	}
	return out
}

func writeScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "job.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
