package compare

import (
	"context"
	"fmt"
	"strconv"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/brokerrpc"
	"github.com/gpupass/gpupass/internal/app/runlog"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// BrokerSource is a Source over the broker's runs API: the series is the
// run's continuous metric series (a step logged again after a NaN restart
// supersedes the earlier value), labelled by region.
type BrokerSource struct {
	// Dial returns the run clients; it is called on the first allocation
	// id, so comparing files alone never needs a broker.
	Dial func() (*client.RunClients, error)
	URL  string
	// Rank is the rank of a run across several nodes whose metrics are
	// read (compare --metrics-rank): 0, the run's own, by default. The
	// run's state, price and restarts are rank 0's, the run's.
	Rank int
}

// GroupRuns implements GroupSource: the allocation ids of a run group's
// runs, oldest first.
func (b *BrokerSource) GroupRuns(ctx context.Context, group string) ([]string, error) {
	c, err := b.Dial()
	if err != nil {
		return nil, err
	}
	runs, err := brokerrpc.GroupRuns(ctx, c, group)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.GetId()
	}
	return ids, nil
}

// sourceText is the Source of a point the agent read from a job's own
// log line (agent/executor.SourceText; the daemon's packages are not
// imported here).
const sourceText = "text"

// Metrics implements Source.
func (b *BrokerSource) Metrics(ctx context.Context, allocID, metric string) (*metrics.Series, error) {
	c, err := b.Dial()
	if err != nil {
		return nil, err
	}
	resp, err := c.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: allocID}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil, fmt.Errorf("%s: no such run on the broker at %s; list runs with `gpupass runs`", allocID, b.URL)
	}
	if err != nil {
		return nil, brokerrpc.Error("reading metrics of "+allocID, b.URL, err)
	}
	if b.Rank != 0 {
		if resp, err = b.rankMetrics(ctx, c, resp.Msg); err != nil {
			return nil, err
		}
	}
	key := metric
	if key == "" {
		key = "loss"
	}
	run := resp.Msg.Run
	s := &metrics.Series{Label: run.GetRegion(), Source: "broker:" + allocID, Metric: key, Format: "gpupass-broker",
		Start: run.GetStartedUnixNano(), Restarts: int(run.GetRestarts()), PricePerHour: run.GetPricePerHour(), Simulated: run.GetSimulated(),
		Slurm: runview.SlurmOf(run)}
	// The broker's own word for where users see the run: linked in the
	// report only if it is an http(s) URL (report.LinkURL).
	if page := run.GetDashboardUrl(); page != "" {
		if _, ok := report.LinkURL(page); ok {
			s.DashboardURL = page
		}
	}
	// Points the agent read from the job's own log lines (`loss 7.89`)
	// count only when the job logged none the gpupass way: a job that
	// does both has its series in the gpupass:metric lines or file, and
	// its printed lines, read until the first of those, would add a
	// second curve at other steps.
	structured := false
	for _, p := range resp.Msg.Points {
		if _, ok := p.Values[key]; ok && p.GetSource() != sourceText {
			structured = true
			break
		}
	}
	text := 0
	var restarts metrics.RestartTracker // where the attempt (process start) changes
	for _, p := range resp.Msg.Points {
		v, ok := p.Values[key]
		if !ok || (structured && p.GetSource() == sourceText) {
			continue
		}
		if p.GetSource() == sourceText {
			text++
		}
		restarts.Point(s, int(p.GetAttempt()), p.Step)
		s.Points = append(s.Points, metrics.Point{Step: p.Step, Value: v, Time: p.TimeUnixNano})
	}
	if text > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d of its %s values were read by the agent from the job's own log lines (`%s 1.23`, `%s=1.23`, `%s: 1.23` or the spec's metrics.pattern)", text, key, key, key, key))
	}
	// The state decides whether the figures are final: compare refuses
	// an unfinished run unless asked (RunNotDoneError), and says how a
	// run ended when it did not succeed.
	state := runview.State(run.GetState())
	s.State = state
	// A log disputed while the run runs is no proof either: the partial
	// curve (--allow-running, --partial) says so as the final one does.
	if run.GetLogDisputed() {
		s.Disputed = runview.DisputedNote(run)
	}
	if !runview.Terminal(run.GetState()) {
		return nil, &RunNotDoneError{ID: allocID, Region: run.GetRegion(), State: state, Series: s}
	}
	if run.GetState() != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
		note := "the run ended " + state
		if r := run.GetReason(); r != "" {
			note += ": " + termsafe.String(r)
		}
		s.Notes = append(s.Notes, note)
	}
	if len(s.Points) == 0 {
		if run.GetState() != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			return nil, fmt.Errorf("%s (%s) ended %s without logging %s values: %s", allocID, termsafe.String(run.GetRegion()), state, key, termsafe.String(run.GetReason()))
		}
		return nil, &metrics.EmptyError{Source: s.Source, Metric: key}
	}
	return s, nil
}

// FieldMetricsRank is the field of a rank the run has not
// (BrokerSource.Rank).
const FieldMetricsRank = "MetricsRank"

// rankMetrics are the points of rank b.Rank of the gang whose run's
// metrics are m, with the run (rank 0) as m has it.
func (b *BrokerSource) rankMetrics(ctx context.Context, c *client.RunClients, m *gpupassv1.GetMetricsResponse) (*connect.Response[gpupassv1.GetMetricsResponse], error) {
	run := m.GetRun()
	nodes := int(run.GetGangNodes())
	switch {
	case nodes < 2:
		return nil, fielderr.New(FieldMetricsRank, "", "is %d, but run %s runs on one node: leave {%s} out", b.Rank, run.GetId(), FieldMetricsRank)
	case run.GetGangRank() != 0:
		return nil, fielderr.New(FieldMetricsRank, "", "is %d, but %s is rank %d of a run, not the run: give the run's id", b.Rank, run.GetId(), run.GetGangRank())
	case b.Rank < 0 || b.Rank >= nodes:
		return nil, fielderr.New(FieldMetricsRank, "", "is %d, but run %s has %d ranks, 0 to %d", b.Rank, run.GetId(), nodes, nodes-1)
	}
	id := runlog.RankID(run.GetId(), b.Rank)
	resp, err := c.Run.GetMetrics(ctx, connect.NewRequest(&gpupassv1.GetMetricsRequest{AllocId: id}))
	if err != nil {
		return nil, brokerrpc.Error("reading metrics of rank "+strconv.Itoa(b.Rank)+" ("+id+")", b.URL, err)
	}
	resp.Msg.Run = run
	return resp, nil
}
