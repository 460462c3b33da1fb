package forge

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Retry is an http.RoundTripper that retries 5xx answers, 429 and
// GitHub's secondary rate limits (403 with Retry-After or that message)
// with exponential backoff, honouring Retry-After.
type Retry struct {
	Base     http.RoundTripper
	Attempts int           // total tries, default 4
	Backoff  time.Duration // first wait, default 1s, doubled each try
	MaxWait  time.Duration // longest single wait, default 60s
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
	wait := backoff
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
		if err != nil {
			cancel()
			return nil, err
		}
		retry, after, why := shouldRetry(resp)
		d := wait
		if after > 0 {
			d = after
		}
		// Waiting longer than a CI step should is worse than failing with
		// the forge's own message.
		if !retry || try >= attempts || d > maxWait {
			resp.Body = cancelOnClose{resp.Body, cancel}
			return resp, nil
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if r.Logger != nil {
			r.Logger.Warn("retrying forge request", "method", req.Method, "path", req.URL.Path, "status", resp.StatusCode, "why", why, "wait", d, "try", try)
		}
		if err := sleep(req.Context(), d); err != nil {
			return nil, err
		}
		wait *= 2
	}
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
