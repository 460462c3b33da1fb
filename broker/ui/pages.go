package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/match"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// Page sizes: a page never holds more rows than these, however large the
// fleet, so its server time and weight stay flat.
const (
	nodesPerPage = 100
	runsPerPage  = 50
	logPageLines = 1000
	// livePollLines bounds one live poll's answer.
	livePollLines = 500
)

// req wraps m in a request carrying the session's token, exactly as the
// CLI sends it.
func req[T any](sess *session, m *T) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set(api.AuthHeader, "Bearer "+sess.secret)
	return r
}

func apiCtx(r *http.Request) context.Context { return withPeer(r.Context(), r.RemoteAddr) }

// apiError writes an API refusal as a page with the matching status.
func (s *Server) apiError(w http.ResponseWriter, r *http.Request, sess *session, what string, err error) {
	code := http.StatusBadGateway
	switch connect.CodeOf(err) {
	case connect.CodePermissionDenied:
		code = http.StatusForbidden
	case connect.CodeNotFound:
		code = http.StatusNotFound
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
		code = http.StatusBadRequest
	case connect.CodeUnauthenticated:
		// The token was revoked since login: the session is over.
		s.endSession(r)
		code = http.StatusUnauthorized
	case connect.CodeResourceExhausted:
		code = http.StatusTooManyRequests
	}
	w.WriteHeader(code)
	s.render(w, r, "error", sess, map[string]any{"Title": "Error", "Error": what + ": " + connectMessage(err)})
}

var funcs = template.FuncMap{
	"num":   func(f float64) string { return report.Num(f) },
	"f1":    func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"f2":    func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) },
	"state": stateName,
	"when":  when,
	"ago":   ago,
	"short": func(s string) string {
		if len(s) > 19 {
			return s[:19] + "…"
		}
		return s
	},
	// The compare page's figures read as the markdown report's do.
	"cost":       report.Cost,
	"throughput": report.Throughput,
	"duration":   report.Duration,
	"safe":       termsafe.String,
	"join":       strings.Join,
	"dur":        runDuration,
	"terminal":   terminal,
	// Where a run waiting for a busy node stands in its region's queue
	// ("" for any other), as gpupass logs says it.
	"queue": runview.QueueNote,
	"fnum":  func(f report.Float) string { return report.Num(float64(f)) },
}

func (s *Server) parseTemplates() error {
	s.tmpl = map[string]*template.Template{}
	for _, name := range []string{"login", "error", "nodes", "dryrun", "runs", "run", "compare"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("ui: parsing template %s: %w", name, err)
		}
		s.tmpl[name] = t
	}
	return nil
}

// render executes page into a buffer first, so a template error is a
// 500, not half a page.
func (s *Server) render(w http.ResponseWriter, r *http.Request, page string, sess *session, data map[string]any) {
	if sess != nil {
		data["Session"] = map[string]any{"Token": sess.tok, "CSRF": sess.csrf,
			"CanCancel": sess.tok.Role == "submit" || sess.tok.Role == "admin"}
	}
	data["Path"] = r.URL.Path
	var b bytes.Buffer
	if err := s.tmpl[page].ExecuteTemplate(&b, "layout", data); err != nil {
		s.log.Error("rendering dashboard page", "page", page, "err", err)
		http.Error(w, "rendering "+page+": internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(b.Bytes())
}

func stateName(s gpupassv1.AllocState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ALLOC_STATE_"))
}

func terminal(s gpupassv1.AllocState) bool {
	return s == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || s == gpupassv1.AllocState_ALLOC_STATE_FAILED ||
		s == gpupassv1.AllocState_ALLOC_STATE_CANCELLED
}

func when(ns int64) string {
	if ns == 0 {
		return "—"
	}
	return time.Unix(0, ns).UTC().Format("2006-01-02 15:04:05Z")
}

func ago(ns int64) string {
	if ns == 0 {
		return "never"
	}
	d := time.Since(time.Unix(0, ns)).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

func runDuration(r *gpupassv1.Run) string {
	if r.StartedUnixNano == 0 {
		return "—"
	}
	end := r.FinishedUnixNano
	if end == 0 {
		end = time.Now().UnixNano()
	}
	return time.Duration(end - r.StartedUnixNano).Round(time.Second).String()
}

func pageOf(r *http.Request) int {
	p, _ := strconv.Atoi(r.URL.Query().Get("page"))
	return max(p, 0)
}

// pager is the links of a paginated table.
type pager struct {
	Page, Pages, Total int
	First, Next        string
}

// nodeView is one node row.
type nodeView struct {
	*gpupassv1.Node
	Certified bool
	Why       string
}

func viewNode(n *gpupassv1.Node) nodeView {
	v := nodeView{Node: n, Certified: n.ConformancePassed && n.Online}
	switch {
	case !n.ConformancePassed && n.ReportGeneratedUnixNano == 0:
		v.Why = "no conformance report yet"
	case !n.ConformancePassed:
		v.Why = "its last conformance report has a failed check"
	case !n.Online:
		v.Why = "offline: no heartbeat since " + when(n.LastSeenUnixNano)
	default:
		v.Why = "conformance passed, online"
	}
	return v
}

func (s *Server) nodesPage(w http.ResponseWriter, r *http.Request, sess *session) {
	q := r.URL.Query()
	region, fp, specFP := q.Get("region"), q.Get("runtime_fingerprint"), strings.TrimSpace(q.Get("spec_fingerprint"))
	m := &gpupassv1.ListNodesRequest{IncludeOffline: true, PageSize: nodesPerPage, PageToken: q.Get("after"), RuntimeFingerprint: fp,
		SpecFingerprint: specFP}
	if region != "" {
		m.Regions = []string{region}
	}
	// One page from the broker's registry snapshot, filters applied
	// there: the page costs a hundred nodes, not the fleet.
	resp, err := s.node.ListNodes(apiCtx(r), req(sess, m))
	if err != nil {
		s.apiError(w, r, sess, "listing nodes", err)
		return
	}
	views := make([]nodeView, 0, len(resp.Msg.Nodes))
	for _, n := range resp.Msg.Nodes {
		views = append(views, viewNode(n))
	}
	total := int(resp.Msg.TotalSize)
	p := keysetPager(r, resp.Msg.NextPageToken)
	p.Total, p.Pages = total, max((total+nodesPerPage-1)/nodesPerPage, 1)
	s.render(w, r, "nodes", sess, map[string]any{"Title": "Nodes", "Nodes": views, "Regions": resp.Msg.FacetRegions,
		"RuntimeFingerprints": resp.Msg.FacetRuntimeFingerprints, "Region": region, "RuntimeFingerprint": fp, "SpecFingerprint": specFP, "Pager": p,
		"DryRunLimit": api.DefaultDryRunLimit})
}

// keysetPager links the pages of a list the API pages by token: next
// follows the answer's token, first drops it. The page number travels
// in the link for display only; the token alone says where a page
// starts, and the broker validates it.
func keysetPager(r *http.Request, next string) pager {
	q := r.URL.Query()
	page := pageOf(r)
	if q.Get("after") == "" {
		page = 0
	}
	p := pager{Page: page + 1}
	if page > 0 {
		q.Del("after")
		q.Del("page")
		p.First = r.URL.Path
		if enc := q.Encode(); enc != "" {
			p.First += "?" + enc
		}
	}
	if next != "" {
		q = r.URL.Query()
		q.Set("after", next)
		q.Set("page", strconv.Itoa(page+1))
		p.Next = r.URL.Path + "?" + q.Encode()
	}
	return p
}

// dryRun asks the broker which nodes can run a pasted or uploaded spec:
// the request `gpupass validate --dry-run` sends, expanded by the same
// function, so the verdicts are the CLI's.
func (s *Server) dryRun(w http.ResponseWriter, r *http.Request, sess *session) {
	spec := []byte(r.PostFormValue("spec"))
	if f, _, err := r.FormFile("specfile"); err == nil {
		b, err := io.ReadAll(io.LimitReader(f, s.cfg.MaxFormBytes+1))
		_ = f.Close()
		if err == nil && len(b) > 0 {
			spec = b
		}
	}
	fail := func(msg string) {
		w.WriteHeader(http.StatusBadRequest)
		s.render(w, r, "dryrun", sess, map[string]any{"Title": "Dry run", "Error": msg, "Spec": string(spec)})
	}
	if len(bytes.TrimSpace(spec)) == 0 {
		fail("paste a gpupass.yaml or choose one to upload")
		return
	}
	minScore := 85.0
	if v := r.PostFormValue("min_health_score"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			fail(fmt.Sprintf("min health score %q: want a number such as 85", v))
			return
		}
		minScore = f
	}
	resp, err := s.node.DryRun(apiCtx(r), req(sess, &gpupassv1.DryRunRequest{
		Spec: &gpupassv1.DryRunRequest_SpecYaml{SpecYaml: spec}, MinHealthScore: &minScore,
		View: gpupassv1.DryRunView_DRY_RUN_VIEW_COLUMNS, DeriveScoreTerms: true, All: r.PostFormValue("all") != "",
	}))
	if err != nil {
		if c := connect.CodeOf(err); c == connect.CodeInvalidArgument || c == connect.CodeFailedPrecondition {
			fail("the spec does not validate: " + connectMessage(err))
			return
		}
		s.apiError(w, r, sess, "dry-run", err)
		return
	}
	if err := api.ExpandDryRun(resp.Msg); err != nil {
		s.apiError(w, r, sess, "reading the dry-run answer", err)
		return
	}
	// The API names out-of-scope nodes by id and region only ("say
	// where, not what"); the dashboard counts them instead, so a scoped
	// token's pages show no node of another region at all.
	// Counted from reason_counts, not the list: the broker lists only the
	// nearest misses unless asked for all, out-of-scope nodes last.
	m := resp.Msg
	outOfScope := int32(0)
	for _, c := range m.ReasonCounts {
		if c.Code == match.CodeRegionScope {
			outOfScope += c.Nodes
			c.ExampleNodeIds = nil
		}
	}
	candidatesLeft := int(m.CandidatesTotal) - len(m.Candidates)
	excludedLeft := int(m.ExcludedTotal) - len(m.Excluded)
	kept := m.Excluded[:0]
	for _, x := range m.Excluded {
		if slices.ContainsFunc(x.Reasons, func(r *gpupassv1.Reason) bool { return r.Code == match.CodeRegionScope }) {
			continue
		}
		kept = append(kept, x)
	}
	m.Excluded = kept
	s.render(w, r, "dryrun", sess, map[string]any{"Title": "Dry run", "DryRun": m, "Spec": string(spec), "OutOfScope": outOfScope,
		"CandidatesLeft": candidatesLeft, "ExcludedLeft": excludedLeft})
}

func (s *Server) runsPage(w http.ResponseWriter, r *http.Request, sess *session) {
	// One page newest first, after the run the page token names (a
	// keyset in the store): every run is reachable, and a late page
	// costs what the first does.
	resp, err := s.run.ListRuns(apiCtx(r), req(sess, &gpupassv1.ListRunsRequest{Limit: runsPerPage, PageToken: r.URL.Query().Get("after")}))
	if err != nil {
		s.apiError(w, r, sess, "listing runs", err)
		return
	}
	s.render(w, r, "runs", sess, map[string]any{"Title": "Runs", "Runs": resp.Msg.Runs, "Pager": keysetPager(r, resp.Msg.NextPageToken)})
}

// logLine is one record as `gpupass logs` prints it.
func logLine(rec *gpupassv1.Record) (line string, metric bool) {
	switch rec.Kind {
	case gpupassv1.RecordKind_RECORD_KIND_CHECKPOINT:
		return "", false
	case gpupassv1.RecordKind_RECORD_KIND_METRIC:
		var m events.Metric
		if err := json.Unmarshal(rec.Data, &m); err != nil {
			return fmt.Sprintf("unreadable metric record %d: %v", rec.Seq, err), true
		}
		b, _ := json.Marshal(m.Values)
		return termsafe.String(fmt.Sprintf("[%s] METRIC step=%d attempt=%d %s", m.Time.UTC().Format(events.TimeLayout), m.Step, m.Attempt, b)), true
	default:
		var e events.Event
		if err := json.Unmarshal(rec.Data, &e); err != nil {
			return fmt.Sprintf("unreadable event record %d: %v", rec.Seq, err), false
		}
		return termsafe.String(e.Text()), false
	}
}

// readLog reads up to n records after seq from the run's log, the store
// `gpupass logs` reads, without following.
func (s *Server) readLog(r *http.Request, sess *session, id string, after uint64, n int, withMetrics bool) (lines []string, points int, last uint64, more bool, err error) {
	ctx, cancel := context.WithCancel(apiCtx(r))
	defer cancel()
	st, err := s.run.GetLogs(ctx, req(sess, &gpupassv1.GetLogsRequest{AllocId: id, AfterSeq: after, IncludeMetrics: withMetrics}))
	if err != nil {
		return nil, 0, after, false, err
	}
	defer st.Close()
	last = after
	for st.Receive() {
		for _, rec := range st.Msg().Records {
			if rec.Seq <= last {
				continue
			}
			if len(lines) >= n {
				return lines, points, last, true, nil
			}
			last = rec.Seq
			l, isMetric := logLine(rec)
			if isMetric {
				points++
				// The agent's own log line already shows the metric.
				continue
			}
			if l != "" {
				lines = append(lines, l)
			}
		}
	}
	return lines, points, last, false, st.Err()
}

func (s *Server) runPage(w http.ResponseWriter, r *http.Request, sess *session) {
	id := r.PathValue("id")
	resp, err := s.run.GetRun(apiCtx(r), req(sess, &gpupassv1.GetRunRequest{AllocId: id}))
	if err != nil {
		s.apiError(w, r, sess, "reading run "+id, err)
		return
	}
	run := resp.Msg.Run
	data := map[string]any{"Title": "Run " + run.Id, "Run": run, "Terminal": terminal(run.State)}
	// A finished run's log is paged from ?after=; a live one shows its
	// tail, and the page script polls for what follows.
	var after uint64
	if v := r.URL.Query().Get("after"); v != "" {
		after, _ = strconv.ParseUint(v, 10, 64)
	} else if !terminal(run.State) && run.HeldThrough > logPageLines {
		after = run.HeldThrough - logPageLines
	}
	lines, _, last, more, err := s.readLog(r, sess, id, after, logPageLines, false)
	if err != nil {
		s.apiError(w, r, sess, "reading the log of "+id, err)
		return
	}
	data["Lines"], data["After"], data["LogFrom"] = lines, last, after
	if more {
		data["NextLog"] = fmt.Sprintf("/ui/runs/%s?after=%d", run.Id, last)
	}
	if mr, err := s.run.GetMetrics(apiCtx(r), req(sess, &gpupassv1.GetMetricsRequest{AllocId: id})); err == nil {
		points, _ := countLoss(mr.Msg.Points)
		data["Points"], data["ChartNote"] = points, chartNote(run, mr.Msg.Points)
	}
	ev, err := s.run.GetRunEvidence(apiCtx(r), req(sess, &gpupassv1.GetRunEvidenceRequest{AllocId: id}))
	switch {
	case err == nil:
		data["Evidence"] = evidenceView(ev.Msg)
	case connect.CodeOf(err) == connect.CodeNotFound || connect.CodeOf(err) == connect.CodeUnimplemented:
		data["EvidenceNote"] = "no signed run report yet: the node sends it when the run starts"
	default:
		data["EvidenceNote"] = "reading the run report: " + connectMessage(err)
	}
	s.render(w, r, "run", sess, data)
}

// countLoss counts the points with a loss value, and of those the
// finite ones (the chart draws only those).
func countLoss(ps []*gpupassv1.MetricPoint) (n, finite int) {
	for _, p := range ps {
		if v, ok := p.Values["loss"]; ok {
			n++
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				finite++
			}
		}
	}
	return n, finite
}

// chartNote says why a run has no loss curve to draw, "" when it has
// one: a chart frame with nothing in it tells a reader nothing, least of
// all that the run never started.
func chartNote(run *gpupassv1.Run, ps []*gpupassv1.MetricPoint) string {
	n, finite := countLoss(ps)
	switch {
	case finite > 0:
		return ""
	case n > 0:
		return fmt.Sprintf("no finite loss values to draw: %d loss point(s), each NaN or infinite", n)
	case run.GetStartedUnixNano() == 0 && terminal(run.GetState()):
		return "no metrics (the run never started)"
	case run.GetStartedUnixNano() == 0:
		return "no metrics yet (the run has not started)"
	case terminal(run.GetState()):
		return "no metrics (the run logged no loss values)"
	default:
		return "no loss values yet"
	}
}

type evidence struct {
	Report, Signature, PublicKey string
	Verified                     bool
	VerifyError                  string
	Received                     int64
	Checks                       []conformance.Check
	Simulated                    bool
	RuntimeFingerprint           string
}

// evidenceView checks the report's signature again here, with the key
// the broker holds for the node, so the page says what it shows is
// signed, not merely that the broker once said so.
func evidenceView(m *gpupassv1.GetRunEvidenceResponse) evidence {
	e := evidence{Signature: m.Signature, PublicKey: string(m.AgentPublicKeyPem), Received: m.ReportReceivedUnixNano}
	var pretty bytes.Buffer
	if json.Indent(&pretty, m.Report, "", "  ") == nil {
		e.Report = pretty.String()
	} else {
		e.Report = string(m.Report)
	}
	if err := conformance.Verify(m.AgentPublicKeyPem, m.Report, m.Signature); err != nil {
		e.VerifyError = err.Error()
	} else {
		e.Verified = true
	}
	if rep, err := conformance.Parse(m.Report); err == nil {
		e.Checks, e.Simulated, e.RuntimeFingerprint = rep.Checks, rep.Simulated, rep.RuntimeFingerprint
	}
	return e
}

// liveAnswer is what the run page's script polls for.
type liveAnswer struct {
	After  uint64   `json:"after"`
	Lines  []string `json:"lines"`
	Points int      `json:"points"`
	State  string   `json:"state"`
	Reason string   `json:"reason"`
	Done   bool     `json:"done"`
}

func (s *Server) runLive(w http.ResponseWriter, r *http.Request, sess *session) {
	id := r.PathValue("id")
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	resp, err := s.run.GetRun(apiCtx(r), req(sess, &gpupassv1.GetRunRequest{AllocId: id}))
	if err != nil {
		http.Error(w, connectMessage(err), http.StatusBadGateway)
		return
	}
	lines, points, last, more, err := s.readLog(r, sess, id, after, livePollLines, true)
	if err != nil {
		http.Error(w, connectMessage(err), http.StatusBadGateway)
		return
	}
	run := resp.Msg.Run
	// The run's state was read before its log: when it was already
	// over and the log is read to the end, nothing more will come.
	a := liveAnswer{After: last, Lines: lines, Points: points, State: stateName(run.State), Reason: run.Reason,
		Done: terminal(run.State) && !more && (run.LogComplete || last >= run.HeldThrough)}
	if a.Lines == nil {
		a.Lines = []string{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(a)
}

// runChart draws the run's loss curve with the SVG code `gpupass
// compare --svg` uses.
func (s *Server) runChart(w http.ResponseWriter, r *http.Request, sess *session) {
	id := r.PathValue("id")
	mr, err := s.run.GetMetrics(apiCtx(r), req(sess, &gpupassv1.GetMetricsRequest{AllocId: id}))
	if err != nil {
		http.Error(w, connectMessage(err), http.StatusBadGateway)
		return
	}
	var b bytes.Buffer
	if note := chartNote(mr.Msg.Run, mr.Msg.Points); note != "" {
		fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="880" height="60"><text x="10" y="35" font-family="sans-serif" font-size="14">%s</text></svg>`, html.EscapeString(note))
		w.Header().Set("Content-Type", "image/svg+xml")
		_, _ = w.Write(b.Bytes())
		return
	}
	ser := api.MetricSeries(mr.Msg, "loss")
	ser.Normalize()
	rep, err := report.Build([]*metrics.Series{ser}, report.Tolerance{})
	if err == nil {
		rep.Verdict = stateName(mr.Msg.Run.GetState())
		err = report.SVG(&b, rep)
	}
	if err != nil {
		var empty *metrics.EmptyError
		if errors.As(err, &empty) || len(ser.Points) == 0 {
			b.Reset()
			b.WriteString(`<svg xmlns="http://www.w3.org/2000/svg" width="880" height="60"><text x="10" y="35" font-family="sans-serif" font-size="14">no loss values yet</text></svg>`)
		} else {
			http.Error(w, "drawing the chart: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	_, _ = w.Write(b.Bytes())
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request, sess *session) {
	id := r.PathValue("id")
	_, err := s.run.Cancel(apiCtx(r), req(sess, &gpupassv1.CancelRequest{AllocId: id, Reason: "cancelled from the dashboard by " + sess.tok.ID}))
	if err != nil {
		s.apiError(w, r, sess, "cancelling "+id, err)
		return
	}
	s.log.Info("dashboard cancel", "alloc", id, "token", sess.tok.ID)
	http.Redirect(w, r, "/ui/runs/"+id, http.StatusSeeOther)
}
