package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/conformance/suite"
	"github.com/gpupass/gpupass/internal/spec"
)

// maxQueryBody bounds a spec posted to the query endpoint (the spec
// parser's own limit is far below).
const maxQueryBody = 1 << 20

// Fingerprint is the answer of GET/POST /v1/fingerprint.
type Fingerprint struct {
	AgentID            string `json:"agent_id,omitempty"`
	RuntimeFingerprint string `json:"runtime_fingerprint"`
	MeasuredAt         string `json:"measured_at"`
	Simulated          bool   `json:"simulated"`
	Profile            string `json:"profile,omitempty"`
	// With a spec posted: its fingerprint, whether they match, and the
	// checks that failed against it.
	SpecFingerprint string              `json:"spec_fingerprint,omitempty"`
	Match           *bool               `json:"match,omitempty"`
	Failed          []conformance.Check `json:"failed,omitempty"`
	SuiteMS         float64             `json:"suite_ms"`
}

// QueryHandler serves the local query endpoint:
//
//	GET  /healthz                 ok
//	GET  /v1/fingerprint          the runtime fingerprint measured now
//	POST /v1/fingerprint          body: a spec (YAML); fingerprint measured
//	                              with its packages and settings, and the match
//	GET  /v1/report               the last signed report and its signature
//	POST /v1/conformance/run      run the suite now, sign, upload; the report
//	GET  /metrics                 Prometheus metrics (agent/agentmetrics)
//
// Probes whose state did not change are reused, so asking often is cheap.
func (a *Agent) QueryHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", a.metrics.Handler()) // Prometheus (agent/agentmetrics)
	mux.HandleFunc("GET /v1/fingerprint", func(w http.ResponseWriter, r *http.Request) {
		a.fingerprint(w, r, nil)
	})
	mux.HandleFunc("POST /v1/fingerprint", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxQueryBody))
		if err != nil {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": "spec larger than 1 MiB"})
			return
		}
		res := spec.Validate("request body", b)
		if !res.Valid {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "the posted spec is not valid", "findings": res.Findings})
			return
		}
		a.fingerprint(w, r, res)
	})
	mux.HandleFunc("GET /v1/report", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		sr := a.last
		a.mu.Unlock()
		sr = a.reportCopy(sr)
		if sr == nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "no report yet: the first suite run has not finished"})
			return
		}
		writeJSON(w, http.StatusOK, sr)
	})
	mux.HandleFunc("POST /v1/conformance/run", func(w http.ResponseWriter, r *http.Request) {
		reply := make(chan runResult, 1)
		select {
		case a.runNow <- reply:
		case <-r.Context().Done():
			return
		case <-time.After(5 * time.Second):
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": errNotRunning.Error() + " (still enrolling?)"})
			return
		}
		select {
		case res := <-reply:
			if res.err != nil && res.rep == nil {
				writeJSON(w, http.StatusInternalServerError, map[string]string{"error": res.err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, a.reportCopy(res.rep))
		case <-r.Context().Done():
		}
	})
	return mux
}

// reportCopy copies sr (nil for nil) under a.mu: the main loop marks a
// report Uploaded under the lock, while the endpoint encodes it.
func (a *Agent) reportCopy(sr *SignedReport) *SignedReport {
	if sr == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c := *sr
	return &c
}

func (a *Agent) fingerprint(w http.ResponseWriter, r *http.Request, sp *spec.Result) {
	var (
		out *Fingerprint
		err error
	)
	if sp == nil {
		out, err = a.CheckSpec(r.Context(), nil)
	} else {
		out, err = a.CheckSpec(r.Context(), sp.Spec)
	}
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// CheckSpec runs the suite now (reusing what cannot have changed) and
// returns the node's runtime fingerprint. With a spec, the fingerprint
// covers the spec's packages as installed here and its job settings, so
// it equals the spec's fingerprint exactly when the node runs what the
// spec declares; the checks that fail against the spec are listed. This
// is the check a run's start-up repeats.
func (a *Agent) CheckSpec(ctx context.Context, sp *spec.Spec) (*Fingerprint, error) {
	exp := a.expectations()
	if sp != nil {
		exp = suite.FromSpec(sp)
		exp.StorageClass = a.o.StorageClass
	}
	res, err := a.suite.Run(ctx, exp)
	if err != nil {
		return nil, err
	}
	f := res.Facts
	out := &Fingerprint{Simulated: f.Simulated(), Profile: f.GPU.Profile, MeasuredAt: time.Now().UTC().Format(time.RFC3339Nano), SuiteMS: float64(res.Wall.Microseconds()) / 1000}
	a.mu.Lock()
	out.AgentID = a.agentID
	a.mu.Unlock()
	if sp == nil {
		out.RuntimeFingerprint, err = suite.RuntimeFingerprint(&f, nil)
		return out, err
	}
	if names := exp.PackageNames(); len(names) > 0 {
		// The suite's Python probe asks about no packages; the spec's are
		// looked up now.
		sec, err := a.python(names).Measure(ctx)
		if err != nil {
			return nil, err
		}
		f.Apply(sec)
	}
	if out.RuntimeFingerprint, err = suite.RuntimeFingerprint(&f, sp); err != nil {
		return nil, err
	}
	if out.SpecFingerprint, err = spec.Fingerprint(sp); err != nil {
		return nil, err
	}
	m := out.RuntimeFingerprint == out.SpecFingerprint
	out.Match = &m
	for _, c := range suite.Evaluate(&f, exp) {
		if c.Status == conformance.Fail {
			out.Failed = append(out.Failed, c)
		}
	}
	return out, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (a *Agent) serveQuery(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: a.QueryHandler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
