package gpupass

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
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// stateName is a run state in lower case (running, succeeded…).
func stateName(s gpupassv1.AllocState) string { return runview.State(s) }

func terminal(s gpupassv1.AllocState) bool {
	return s == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || s == gpupassv1.AllocState_ALLOC_STATE_FAILED ||
		s == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
}

// BrokerMetrics is compare's MetricsSource over the broker's runs API:
// the series is the run's continuous metric series (a step logged again
// after a NaN restart supersedes the earlier value), labelled by region.
type BrokerMetrics struct {
	Broker *BrokerFlags
}

// Metrics implements MetricsSource.
func (m *BrokerMetrics) Metrics(ctx context.Context, allocID, metric string) (*metrics.Series, error) {
	c, err := m.Broker.DialRuns()
	if err != nil {
		return nil, err
	}
	resp, err := c.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: allocID}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil, fmt.Errorf("%s: no such run on the broker at %s; list runs with `gpupass runs`", allocID, m.Broker.URL)
	}
	if err != nil {
		return nil, rpcError("reading metrics of "+allocID, m.Broker.URL, err)
	}
	key := metric
	if key == "" {
		key = "loss"
	}
	run := resp.Msg.Run
	s := &metrics.Series{Label: run.GetRegion(), Source: "broker:" + allocID, Metric: key, Format: "gpupass-broker",
		Start: run.GetStartedUnixNano(), Restarts: int(run.GetRestarts()), PricePerHour: run.GetPricePerHour(), Simulated: run.GetSimulated(),
		Slurm: runview.SlurmOf(run)}
	for _, p := range resp.Msg.Points {
		v, ok := p.Values[key]
		if !ok {
			continue
		}
		s.Points = append(s.Points, metrics.Point{Step: p.Step, Value: v, Time: p.TimeUnixNano})
	}
	// The state decides whether the figures are final: compare refuses
	// an unfinished run unless asked (RunNotDoneError), and says how a
	// run ended when it did not succeed.
	if !terminal(run.GetState()) {
		return nil, &RunNotDoneError{ID: allocID, Region: run.GetRegion(), State: stateName(run.GetState()), Series: s}
	}
	if run.GetLogDisputed() {
		s.Disputed = disputedNote(run)
	}
	if run.GetState() != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
		note := "the run ended " + stateName(run.GetState())
		if r := run.GetReason(); r != "" {
			note += ": " + termsafe.String(r)
		}
		s.Notes = append(s.Notes, note)
	}
	if len(s.Points) == 0 {
		if run.GetState() != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			return nil, fmt.Errorf("%s (%s) ended %s without logging %s values: %s", allocID, termsafe.String(run.GetRegion()), stateName(run.GetState()), key, termsafe.String(run.GetReason()))
		}
		return nil, &metrics.EmptyError{Source: s.Source, Metric: key}
	}
	return s, nil
}

// logPrinter writes records of one or more runs to one writer.
type logPrinter struct {
	mu     sync.Mutex
	out    io.Writer
	json   bool
	prefix bool // prefix text lines with the run's region
}

func (p *logPrinter) print(run *gpupassv1.Run, r *gpupassv1.Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		// One JSON object per line: the record's own JSON plus where
		// it came from.
		var obj map[string]any
		if err := json.Unmarshal(r.Data, &obj); err != nil {
			obj = map[string]any{"unreadable": string(r.Data)}
		}
		obj["seq"], obj["alloc_id"], obj["region"] = r.Seq, run.Id, run.Region
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
		_, err = fmt.Fprintf(p.out, "%s\n", b)
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
	if p.prefix {
		line = run.Region + " | " + line
	}
	// The line is the job's output: a terminal must show it, not obey it.
	_, err := fmt.Fprintln(p.out, termsafe.String(line))
	return err
}

// followRun streams a run's records to p from after (exclusive) and
// returns the final run when following, reconnecting with the last seq
// seen when the broker restarts or the connection drops, so no record is
// lost or printed twice.
func followRun(ctx context.Context, c *client.RunClients, run *gpupassv1.Run, after uint64, follow, withMetrics bool, p *logPrinter, log *slog.Logger) (*gpupassv1.Run, error) {
	backoff := 200 * time.Millisecond
	failingSince := time.Time{}
	for {
		st, err := c.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: run.Id, AfterSeq: after, Follow: follow, IncludeMetrics: withMetrics}))
		if err == nil {
			for st.Receive() {
				failingSince, backoff = time.Time{}, 200*time.Millisecond
				for _, r := range st.Msg().Records {
					if r.Seq <= after {
						continue
					}
					if err := p.print(run, r); err != nil {
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
		log.Warn("log stream interrupted; reconnecting", "alloc", run.Id, "after_seq", after, "err", api.Describe(err))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
