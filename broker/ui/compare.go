package ui

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// maxCompared bounds the runs of one comparison (pairs grow as n²).
const maxCompared = 8

// comparePage makes the comparison `gpupass compare ALLOC…` makes: the
// same series from the same API, built, judged and drawn by package
// report (the tables from the figures the markdown tables show, written
// by report's formatters and in the same pair order, the chart by its
// SVG code).
func (s *Server) comparePage(w http.ResponseWriter, r *http.Request, sess *session) {
	q := r.URL.Query()
	ids := q["run"]
	tolText := q.Get("tolerance")
	if tolText == "" {
		tolText = "5%" // compare's --tolerance default
	}
	data := map[string]any{"Title": "Compare", "Tolerance": tolText, "Selected": ids}
	if len(ids) < 2 {
		resp, err := s.run.ListRuns(apiCtx(r), req(sess, &gpupassv1.ListRunsRequest{Limit: 100}))
		if err != nil {
			s.apiError(w, r, sess, "listing runs", err)
			return
		}
		data["Runs"] = resp.Msg.Runs
		if len(ids) == 1 {
			data["Error"] = "pick at least two runs"
		}
		s.render(w, r, "compare", sess, data)
		return
	}
	fail := func(msg string) {
		w.WriteHeader(http.StatusBadRequest)
		data["Error"] = msg
		s.render(w, r, "compare", sess, data)
	}
	if len(ids) > maxCompared {
		fail(fmt.Sprintf("%d runs picked; compare at most %d at once", len(ids), maxCompared))
		return
	}
	tol, err := report.ParseTolerance(tolText)
	if err != nil {
		fail("tolerance: " + err.Error())
		return
	}
	series := make([]*metrics.Series, 0, len(ids))
	count := map[string]int{}
	for _, id := range ids {
		mr, err := s.run.GetMetrics(apiCtx(r), req(sess, &gpupassv1.GetMetricsRequest{AllocId: id}))
		if err != nil {
			if connect.CodeOf(err) == connect.CodeNotFound || connect.CodeOf(err) == connect.CodePermissionDenied {
				fail(id + ": " + connectMessage(err))
				return
			}
			s.apiError(w, r, sess, "reading metrics of "+id, err)
			return
		}
		run := mr.Msg.Run
		ser := api.MetricSeries(mr.Msg, "loss")
		if !terminal(run.GetState()) {
			ser.Notes = append(ser.Notes, fmt.Sprintf("%s was still %s when compared: its figures are partial", id, stateName(run.GetState())))
		} else if run.GetState() != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
			ser.Notes = append(ser.Notes, "the run ended "+stateName(run.GetState())+": "+termsafe.String(run.GetReason()))
		}
		if run.GetLogDisputed() {
			ser.Disputed = fmt.Sprintf("log disputed: %d record(s) were sent twice with different content (first at seq %d); the broker kept the first of each, so this log is not proof of what the run printed", run.GetDisputedRecords(), run.GetFirstDisputedSeq())
		}
		if len(ser.Points) == 0 {
			fail(fmt.Sprintf("%s (%s) has no loss values to compare", id, run.GetRegion()))
			return
		}
		ser.Normalize()
		count[ser.Label]++
		series = append(series, ser)
	}
	// Two runs in one region: name them by region and id, as compare does.
	for i, ser := range series {
		if count[ser.Label] > 1 {
			ser.Label += " " + ids[i]
		}
	}
	rep, err := report.Build(series, tol)
	if err != nil {
		fail(err.Error())
		return
	}
	var svg bytes.Buffer
	if err := report.SVG(&svg, rep); err != nil {
		fail("drawing the chart: " + err.Error())
		return
	}
	data["Report"] = rep
	// report.SVG escapes every label it writes.
	data["SVG"] = template.HTML(svg.String()) //nolint:gosec // generated, escaped by report.SVG
	s.render(w, r, "compare", sess, data)
}
