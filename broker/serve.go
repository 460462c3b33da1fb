package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/gpupass/gpupass/broker/brokermetrics"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// ServeOptions configure Serve.
type ServeOptions struct {
	// TLSCertFile and TLSKeyFile enable TLS (HTTP/2 over TLS); without
	// them the broker speaks cleartext HTTP/1.1 and HTTP/2 (h2c), for
	// loopback and private networks.
	TLSCertFile, TLSKeyFile string
	// ShutdownTimeout bounds the graceful shutdown (default 10 s).
	ShutdownTimeout time.Duration
	// Limits bound connections, request body memory and body pace.
	Limits HTTPLimits
}

// Serve serves b on ln until ctx is cancelled, then shuts down gracefully:
// stops accepting, lets in-flight calls finish, flushes heartbeats.
// Fields of serve's option errors (*fielderr.Error).
const (
	FieldTLSCert = "TLS certificate"
	FieldTLSKey  = "TLS key"
)

func Serve(ctx context.Context, ln net.Listener, b *Broker, o ServeOptions) (err error) {
	// A refused option stops b's background loops too: they would go on
	// (and log) after Serve returned, with nobody to stop them.
	serving := false
	defer func() {
		if !serving {
			_ = closeBroker(b)
		}
	}()
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	lim, err := o.Limits.withDefaults(openFileLimit(), b.log)
	if err != nil {
		return err
	}
	ln = newConnLimiter(ln, lim, b.log, func() { b.metrics.Refused(brokermetrics.ConnsRefusal) })
	srv := &http.Server{
		Handler:           newGuard(b, b.Handler(), lim),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       lim.IdleTimeout,
		ErrorLog:          nil,
		// No ReadTimeout or WriteTimeout: they would end long polls and
		// log follows. The guard bounds request bodies instead.
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: 250,
			// Ping a connection silent this long; close it if the ping
			// goes unanswered, or if a response makes no progress.
			SendPingTimeout:  time.Minute,
			PingTimeout:      15 * time.Second,
			WriteByteTimeout: time.Minute,
		},
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	useTLS := o.TLSCertFile != "" || o.TLSKeyFile != ""
	if useTLS {
		if o.TLSCertFile == "" || o.TLSKeyFile == "" {
			return &fielderr.Error{Field: FieldTLSCert, Problem: "and {TLS key} go together: give both or neither"}
		}
		cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("loading TLS certificate %s: %w", o.TLSCertFile, err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	// Long polls (PollWork) and log follows (GetLogs) end only when the
	// broker stops; Shutdown waits for in-flight calls, so without this it
	// would always run to its timeout with an agent connected. They return
	// as shutdown begins and the agents call again, elsewhere or later.
	srv.RegisterOnShutdown(b.stopWaiting)
	serving = true // from here on, both ways out close b
	errc := make(chan error, 1)
	go func() {
		if useTLS {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		_ = closeBroker(b)
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	// A separate context: the serving one is already cancelled.
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if cerr := closeBroker(b); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// finalFlushTimeout bounds each heartbeat flush: those in the background
// and the last one at shutdown.
const finalFlushTimeout = 10 * time.Second

// closeBroker closes b with a context of its own: the shutdown's may have
// run out waiting for calls, and the buffered heartbeats are still owed
// to the store.
func closeBroker(b *Broker) error {
	ctx, cancel := context.WithTimeout(context.Background(), finalFlushTimeout)
	defer cancel()
	return b.Close(ctx)
}
