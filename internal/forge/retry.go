package forge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gpupass/gpupass/internal/retry"
)

// Retry is an http.RoundTripper that retries 429 and GitHub's secondary
// rate limits (403 with Retry-After or that message) and connections that
// could not be opened, for every method, and 5xx answers for idempotent
// methods, with the project's back-off (internal/retry: growing, jittered,
// capped at MaxWait), honouring Retry-After.
//
// A non-idempotent request (a POST: it creates a comment) is not sent
// again after an outcome that may mean the forge applied it: a 5xx answer
// (GitHub and GitLab both answer 502 after a write now and then), or a
// connection that broke or timed out once the request was on its way.
// Retry returns an *UncertainError then, and the caller looks whether
// the request took effect (see Post). Refusals before processing (429,
// secondary rate limits) and failures to connect are safe to resend.
type Retry struct {
	Base     http.RoundTripper
	Attempts int           // total tries, default 4
	Backoff  time.Duration // shortest wait, default 1s; each try's is drawn by retry.Backoff
	MaxWait  time.Duration // longest single wait, default 60s (a longer Retry-After ends the retries)
	// AttemptTimeout bounds each try, body included (0: no bound). It
	// stands in for http.Client.Timeout, which would also count the
	// waits between tries and so cut off a Retry-After it should honour.
	AttemptTimeout time.Duration
	// Sleep waits or returns ctx's error; tests replace it.
	Sleep  func(ctx context.Context, d time.Duration) error
	Logger *slog.Logger
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// RoundTrip implements http.RoundTripper.
func (r *Retry) RoundTrip(req *http.Request) (*http.Response, error) {
	base := r.Base
	if base == nil {
		base = http.DefaultTransport
	}
	attempts, backoff, maxWait := r.Attempts, r.Backoff, r.MaxWait
	if attempts <= 0 {
		attempts = 4
	}
	if backoff <= 0 {
		backoff = time.Second
	}
	if maxWait <= 0 {
		maxWait = time.Minute
	}
	sleep := r.Sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("buffering request body: %w", err)
		}
		body = b
	}
	bo := retry.Backoff(backoff, maxWait)
	for try := 1; ; try++ {
		ctx, cancel := req.Context(), context.CancelFunc(func() {})
		if r.AttemptTimeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, r.AttemptTimeout)
		}
		rq := req.Clone(ctx)
		if body != nil {
			rq.Body = io.NopCloser(bytes.NewReader(body))
			rq.ContentLength = int64(len(body))
		}
		resp, err := base.RoundTrip(rq)
		var d time.Duration
		var why, outcome string
		if err != nil {
			cancel()
			switch {
			case req.Context().Err() != nil:
				return nil, err
			case !unsent(err) && !idempotent(req):
				return nil, &UncertainError{Err: err}
			case !unsent(err) || try >= attempts:
				return nil, err
			}
			d, why, outcome = bo.NextBackOff(), "could not connect", err.Error()
		} else {
			if resp.StatusCode >= 500 && !idempotent(req) {
				msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				resp.Body.Close()
				cancel()
				// One line, whether the forge sent JSON or a proxy's HTML page.
				return nil, &UncertainError{Status: resp.Status, Message: strings.Join(strings.Fields(string(msg)), " ")}
			}
			again, after, w := shouldRetry(resp)
			why, d = w, after
			if d <= 0 {
				d = bo.NextBackOff()
			}
			// Waiting longer than a CI step should is worse than failing
			// with the forge's own message.
			if !again || try >= attempts || d > maxWait {
				resp.Body = cancelOnClose{resp.Body, cancel}
				return resp, nil
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			cancel()
			outcome = resp.Status
		}
		r.warn(req, why, outcome, d, try)
		if err := sleep(req.Context(), d); err != nil {
			return nil, err
		}
	}
}

func (r *Retry) warn(req *http.Request, why, outcome string, wait time.Duration, try int) {
	if r.Logger != nil {
		r.Logger.Warn("retrying forge request", "method", req.Method, "path", req.URL.Path, "outcome", outcome, "why", why, "wait", wait, "try", try)
	}
}

// UncertainError says a non-idempotent request failed in a way that
// leaves open whether the forge applied it, so Retry did not send it
// again: a 5xx answer (Status set), or a connection that broke or timed
// out after the request was sent (Err set).
type UncertainError struct {
	Status  string // the answer's status line, when there was one
	Message string // the start of the answer's body
	Err     error  // the connection's error, when there was no answer
}

// Error leaves out method and URL: http.Client wraps it in a *url.Error
// that names them.
func (e *UncertainError) Error() string {
	what := "the request was sent but no answer came: " + fmt.Sprint(e.Err)
	if e.Status != "" {
		what = "the forge answered " + e.Status
		if e.Message != "" {
			what += " (" + e.Message + ")"
		}
	}
	return what + "; the forge may have applied it all the same"
}

func (e *UncertainError) Unwrap() error { return e.Err }

// Uncertain reports whether err leaves open whether a request that
// changes something took effect.
func Uncertain(err error) bool {
	var u *UncertainError
	return errors.As(err, &u)
}

// idempotent reports whether sending req twice has the effect of sending
// it once. PATCH counts: gpupass only PATCHes whole comment bodies. POST
// does not: each one creates a comment or note.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete, http.MethodPatch:
		return true
	}
	return false
}

// unsent reports whether err means the request never left: the
// connection (or the proxy's tunnel) could not be opened.
func unsent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect")
}

// cancelOnClose ends a try's context once its body is read and closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func shouldRetry(resp *http.Response) (bool, time.Duration, string) {
	after := retryAfter(resp.Header.Get("Retry-After"))
	switch {
	case resp.StatusCode >= 500:
		return true, after, "server error"
	case resp.StatusCode == http.StatusTooManyRequests:
		return true, after, "rate limited"
	case resp.StatusCode == http.StatusForbidden:
		if after > 0 {
			return true, after, "secondary rate limit"
		}
		// Peek at the body without consuming it for the caller.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), resp.Body))
		if strings.Contains(strings.ToLower(string(b)), "secondary rate limit") {
			return true, 0, "secondary rate limit"
		}
	}
	return false, 0, ""
}

func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}
