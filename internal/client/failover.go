package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/retry"
)

// Several brokers on one store (replicas) are reached through one client:
// the broker URL may be a comma-separated list, and every call goes to the
// replica the client is on. When that replica stops answering, the client
// moves to the next one. A call is sent again to the next replica only when
// it cannot have reached the first (the connection was refused, or timed
// out before it was made); one that broke after it was sent returns its
// error, since the broker may have acted on it, and the caller's next call
// goes to the next replica. A replica that failed is skipped for a
// jittered, growing back-off (FailoverBackoff*), so clients do not all come
// back to it at once.

const (
	// FailoverDialTimeout bounds connecting to one replica when there are
	// several: a host that does not answer costs this long, then the next
	// replica is tried.
	FailoverDialTimeout = 5 * time.Second
	// FailoverBackoffInitial and FailoverBackoffMax bound how long a
	// replica that failed is skipped (growing per failure with jitter, internal/retry).
	FailoverBackoffInitial = 500 * time.Millisecond
	FailoverBackoffMax     = 30 * time.Second
	// MaxBrokerURLs bounds the list.
	MaxBrokerURLs = 16
)

// ParseURLs splits a broker URL list ("http://a:7070,http://b:7070"; one
// URL is a list of one) and checks each URL. All must have one scheme:
// one HTTP client serves them all.
func ParseURLs(list string) ([]*url.URL, error) {
	var out []*url.URL
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, &URLError{URL: s}
		}
		if len(out) > 0 && u.Scheme != out[0].Scheme {
			return nil, fmt.Errorf("broker URLs %s and %s: all replicas must use one scheme (http or https)", out[0].Redacted(), u.Redacted())
		}
		out = append(out, u)
	}
	if len(out) == 0 {
		return nil, &URLError{URL: list}
	}
	if len(out) > MaxBrokerURLs {
		return nil, fmt.Errorf("%d broker URLs: at most %d", len(out), MaxBrokerURLs)
	}
	return out, nil
}

// failover sends each request to the current replica and moves on when
// it stops answering.
type failover struct {
	urls     []*url.URL
	next     http.RoundTripper
	onSwitch func(from, to string, err error)

	mu    sync.Mutex
	cur   int
	until []time.Time // a failed replica is skipped until then
	bo    []backoff.BackOff
}

func newFailover(urls []*url.URL, next http.RoundTripper, onSwitch func(from, to string, err error)) *failover {
	f := &failover{urls: urls, next: next, onSwitch: onSwitch, until: make([]time.Time, len(urls))}
	for range urls {
		// The agent loops' back-off (decorrelated jitter): clients cut
		// off by one replica's death do not all retry it together.
		f.bo = append(f.bo, retry.Backoff(FailoverBackoffInitial, FailoverBackoffMax))
	}
	return f
}

// pick returns the replica to try: the current one unless it is backing
// off, else the next one that is not, else the one that comes back
// first, with how long to wait for it.
func (f *failover) pick(now time.Time) (int, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	best := f.cur
	for k := range f.urls {
		i := (f.cur + k) % len(f.urls)
		if !now.Before(f.until[i]) {
			return i, 0
		}
		if f.until[i].Before(f.until[best]) {
			best = i
		}
	}
	return best, f.until[best].Sub(now)
}

func (f *failover) succeeded(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.until[i] = time.Time{}
	f.bo[i].Reset()
	f.cur = i
}

// failed puts replica i into back-off and moves the client to the next.
func (f *failover) failed(i int, err error) {
	f.mu.Lock()
	f.until[i] = time.Now().Add(f.bo[i].NextBackOff())
	moved := f.cur == i
	if moved {
		f.cur = (i + 1) % len(f.urls)
	}
	to := f.urls[f.cur]
	f.mu.Unlock()
	if moved && f.onSwitch != nil {
		f.onSwitch(f.urls[i].Redacted(), to.Redacted(), err)
	}
}

// Current is the replica calls go to now (for logs and tests).
func (f *failover) Current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.urls[f.cur].String()
}

func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	var lastErr error
	for attempt := range len(f.urls) {
		i, wait := f.pick(time.Now())
		if wait > 0 {
			// Every replica failed a moment ago: wait for the first to
			// come out of back-off rather than hammer them all.
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				if lastErr != nil {
					return nil, lastErr
				}
				return nil, ctx.Err()
			case <-t.C:
			}
		}
		r := req.Clone(ctx)
		r.URL.Scheme, r.URL.Host, r.Host = f.urls[i].Scheme, f.urls[i].Host, ""
		if attempt > 0 && req.Body != nil && req.Body != http.NoBody {
			if req.GetBody == nil {
				return nil, lastErr // a streamed body cannot be sent twice
			}
			b, err := req.GetBody()
			if err != nil {
				return nil, lastErr
			}
			r.Body = b
		}
		resp, err := f.next.RoundTrip(r)
		if err == nil {
			f.succeeded(i)
			resp.Body = &watchedBody{ReadCloser: resp.Body, f: f, i: i, ctx: ctx}
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if _, ok := api.PlainHTTP(err); ok {
			return nil, err // the rule refused it: the replica did not fail
		}
		f.failed(i, err)
		lastErr = err
		if !notSent(err) {
			return nil, err
		}
	}
	return nil, lastErr
}

// notSent reports whether err shows that the request never reached the
// broker, so that sending it to another replica cannot do it twice.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return false
}

// watchedBody moves the client on when a stream from the replica breaks
// (the broker died mid-answer): the caller's next call goes elsewhere
// instead of trying the dead replica first.
type watchedBody struct {
	io.ReadCloser
	f    *failover
	i    int
	ctx  context.Context
	once sync.Once
}

func (w *watchedBody) Read(p []byte) (int, error) {
	n, err := w.ReadCloser.Read(p)
	if err != nil && err != io.EOF && w.ctx.Err() == nil {
		w.once.Do(func() { w.f.failed(w.i, err) })
	}
	return n, err
}
