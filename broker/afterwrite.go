package broker

import (
	"context"
	"net/http"
	"sync"
)

// afterWrite runs fn once the answer of the call ctx belongs to has been
// written, when the call came through withAfterWrite, and reports whether
// it will; otherwise it does nothing and reports false. Handlers use it to
// give buffers that the answer refers to back to a pool: a unary Connect
// handler's ServeHTTP returns only after the answer is marshalled and
// written, so nothing refers to them after.
func afterWrite(ctx context.Context, fn func()) bool {
	l, ok := ctx.Value(afterWriteKey{}).(*afterWriteList)
	if !ok {
		return false
	}
	l.mu.Lock()
	l.fns = append(l.fns, fn)
	l.mu.Unlock()
	return true
}

type afterWriteKey struct{}

type afterWriteList struct {
	mu  sync.Mutex
	fns []func()
}

// withAfterWrite lets the handlers of h use afterWrite. Only for unary
// handlers: a streaming one may still be writing from another goroutine
// when ServeHTTP returns (it does not, but nothing here would enforce it).
func withAfterWrite(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l := &afterWriteList{}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), afterWriteKey{}, l)))
		l.mu.Lock()
		fns := l.fns
		l.fns = nil
		l.mu.Unlock()
		for _, fn := range fns {
			fn()
		}
	})
}
