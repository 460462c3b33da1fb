package ui

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// handlerTransport sends the dashboard's API calls straight into the
// broker's own API handler, in process. The calls still carry the
// session's token in the Authorization header and pass through the same
// interceptors as a CLI call, so roles and region scope are checked by
// the very code that checks them for `gpupass`, not by a copy here.
type handlerTransport struct{ h http.Handler }

type peerKey struct{}

// withPeer records the browser's address, so the broker's log of a
// refused call names the client, not the dashboard.
func withPeer(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, peerKey{}, addr)
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RemoteAddr, _ = req.Context().Value(peerKey{}).(string)
	if r.RemoteAddr == "" {
		r.RemoteAddr = "127.0.0.1:0"
	}
	r.RequestURI = r.URL.RequestURI()
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			w.writeHeader(http.StatusOK)
			_ = pw.Close()
		}()
		t.h.ServeHTTP(w, r)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{Status: http.StatusText(w.code), StatusCode: w.code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: pr, ContentLength: -1, Request: req}, nil
}

// pipeResponse is a ResponseWriter whose body streams to the caller, so
// a server stream (GetLogs) arrives message by message.
type pipeResponse struct {
	header http.Header
	sent   http.Header
	pw     *io.PipeWriter
	once   sync.Once
	code   int
	ready  chan struct{}
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) writeHeader(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeResponse) WriteHeader(code int) { w.writeHeader(code) }

func (w *pipeResponse) Write(p []byte) (int, error) {
	w.writeHeader(http.StatusOK)
	return w.pw.Write(p)
}

// Flush is a no-op: every Write already reaches the reader.
func (w *pipeResponse) Flush() {}
