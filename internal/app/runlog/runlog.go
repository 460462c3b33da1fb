// Package runlog streams a run's log records from the broker and prints
// them: the follower behind `gpupass logs` and `gpupass train --follow`.
// It reconnects after the last record seen, so none is lost or printed
// twice across a broker restart.
package runlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/retry"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// Printer writes records of one or more runs to one writer, one line
// each: text (escaped for the terminal), or JSON objects.
type Printer struct {
	mu     sync.Mutex
	Out    io.Writer
	JSON   bool
	Prefix bool // prefix text lines with the run's region
}

// Print writes one record of run.
func (p *Printer) Print(run *gpupassv1.Run, r *gpupassv1.Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.JSON {
		// One JSON object per line: the record's own JSON plus where
		// it came from.
		var obj map[string]any
		if err := json.Unmarshal(r.Data, &obj); err != nil {
			obj = map[string]any{"unreadable": string(r.Data)}
		}
		obj["seq"], obj["alloc_id"], obj["region"] = r.Seq, run.Id, run.Region
		if run.GetGangNodes() > 1 {
			obj["rank"] = run.GetGangRank()
		}
		switch r.Kind {
		case gpupassv1.RecordKind_RECORD_KIND_METRIC:
			obj["kind"] = "metric"
		case gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT:
			obj["kind"] = "checkpoint"
		}
		b, err := json.Marshal(obj)
		if err != nil {
			return fmt.Errorf("encoding record %d: %w", r.Seq, err)
		}
		_, err = fmt.Fprintf(p.Out, "%s\n", b)
		return err
	}
	var line string
	switch r.Kind {
	case gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT:
		// A chunk of a shipped checkpoint file; the agent's INFO event
		// "checkpoint … shipped" already says so in the log.
		return nil
	case gpupassv1.RecordKind_RECORD_KIND_METRIC:
		var m events.Metric
		if err := json.Unmarshal(r.Data, &m); err != nil {
			line = fmt.Sprintf("unreadable metric record %d: %v", r.Seq, err)
			break
		}
		b, _ := json.Marshal(m.Values)
		line = fmt.Sprintf("[%s] METRIC step=%d attempt=%d %s", m.Time.UTC().Format(events.TimeLayout), m.Step, m.Attempt, b)
	default:
		var e events.Event
		if err := json.Unmarshal(r.Data, &e); err != nil {
			line = fmt.Sprintf("unreadable event record %d: %v", r.Seq, err)
			break
		}
		line = e.Text()
	}
	switch {
	case run.GetGangNodes() > 1:
		// A gang's ranks share one terminal: each line says whose.
		line = PrefixRegion(fmt.Sprintf("%s/%d", run.Region, run.GetGangRank()), line)
	case p.Prefix:
		line = PrefixRegion(run.Region, line)
	}
	// The line is the job's output: a terminal must show it, not obey it.
	_, err := fmt.Fprintln(p.Out, termsafe.String(line))
	return err
}

// PrefixRegion is the one form of a log line marked with the region it
// came from, wherever runs of several regions share one terminal
// (`train --follow`, `logs`, `up --demo`).
func PrefixRegion(region, line string) string {
	return region + " | " + line
}

// RankID is the allocation id of rank n of the gang whose run (rank 0)
// is run: the run's own id for rank 0, "RUN-rN" for the others.
func RankID(run string, n int) string {
	if n == 0 {
		return run
	}
	return fmt.Sprintf("%s-r%d", run, n)
}

// Ranks are the allocations of run's gang, rank 0 (run) first; run alone
// for a run on one node.
func Ranks(ctx context.Context, c *client.RunClients, run *gpupassv1.Run) ([]*gpupassv1.Run, error) {
	out := []*gpupassv1.Run{run}
	if run.GetGangNodes() < 2 || run.GetGangRank() != 0 {
		return out, nil
	}
	for n := 1; n < int(run.GetGangNodes()); n++ {
		id := RankID(run.Id, n)
		r, err := c.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			return nil, fmt.Errorf("reading rank %d (%s) of %s: %s", n, id, run.Id, api.Describe(err))
		}
		out = append(out, r.Msg.Run)
	}
	return out, nil
}

// FollowGang is Follow for every rank of run's gang at once (run alone
// on one node), each line marked with its rank by p; it returns rank
// 0's final run, once every rank's log has been read.
func FollowGang(ctx context.Context, c *client.RunClients, run *gpupassv1.Run, after uint64, follow, withMetrics bool, p *Printer, log *slog.Logger) (*gpupassv1.Run, error) {
	ranks, err := Ranks(ctx, c, run)
	if err != nil {
		return nil, err
	}
	if len(ranks) == 1 {
		return Follow(ctx, c, run, after, follow, withMetrics, p, log)
	}
	fins := make([]*gpupassv1.Run, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { fins[i], errs[i] = Follow(ctx, c, r, after, follow, withMetrics, p, log) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return fins[0], nil
}

// Follow streams a run's records to p from after (exclusive) and
// returns the final run when following, reconnecting with the last seq
// seen when the broker restarts or the connection drops, so no record is
// lost or printed twice.
func Follow(ctx context.Context, c *client.RunClients, run *gpupassv1.Run, after uint64, follow, withMetrics bool, p *Printer, log *slog.Logger) (*gpupassv1.Run, error) {
	bo := retry.Backoff(200*time.Millisecond, 5*time.Second)
	failingSince := time.Time{}
	for {
		st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, AfterSeq: after, Follow: follow, IncludeMetrics: withMetrics}))
		if err == nil {
			for st.Receive() {
				failingSince = time.Time{}
				bo.Reset()
				for _, r := range st.Msg().Records {
					if r.Seq <= after {
						continue
					}
					if err := p.Print(run, r); err != nil {
						st.Close()
						return nil, err
					}
					after = r.Seq
				}
				if fin := st.Msg().Run; fin != nil {
					st.Close()
					return fin, nil
				}
			}
			err = st.Err()
			st.Close()
			if err == nil {
				if !follow {
					return run, nil
				}
				err = errors.New("stream ended before the run did")
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch connect.CodeOf(err) {
		case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeNotFound, connect.CodeInvalidArgument, connect.CodeUnimplemented:
			return nil, fmt.Errorf("reading logs of %s: %s", run.Id, api.Describe(err))
		}
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		if time.Since(failingSince) > 5*time.Minute {
			return nil, fmt.Errorf("reading logs of %s: broker unreachable for 5 minutes: %s", run.Id, api.Describe(err))
		}
		wait := bo.NextBackOff()
		log.Warn("log stream interrupted; reconnecting", "alloc", run.Id, "after_seq", after, "in", wait, "err", api.Describe(err))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}
