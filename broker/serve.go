package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// ServeOptions configure Serve.
type ServeOptions struct {
	// TLSCertFile and TLSKeyFile enable TLS (HTTP/2 over TLS); without
	// them the broker speaks cleartext HTTP/1.1 and HTTP/2 (h2c), for
	// loopback and private networks.
	TLSCertFile, TLSKeyFile string
	// ShutdownTimeout bounds the graceful shutdown (default 10 s).
	ShutdownTimeout time.Duration
}

// Serve serves b on ln until ctx is cancelled, then shuts down gracefully:
// stops accepting, lets in-flight calls finish, flushes heartbeats.
func Serve(ctx context.Context, ln net.Listener, b *Broker, o ServeOptions) error {
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	srv := &http.Server{
		Handler:           b.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          nil,
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	useTLS := o.TLSCertFile != "" || o.TLSKeyFile != ""
	if useTLS {
		if o.TLSCertFile == "" || o.TLSKeyFile == "" {
			return errors.New("TLS needs both --tls-cert and --tls-key")
		}
		cert, err := tls.LoadX509KeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("loading TLS certificate %s: %w", o.TLSCertFile, err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
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
		_ = b.Close(context.Background())
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	// A separate context: the serving one is already cancelled.
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if cerr := b.Close(sctx); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}
