package broker_test

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

func TestTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := brokertest.SelfSigned(t)
	s := brokertest.NewDB(t, "sqlite").Open(t)
	b := broker.New(broker.Config{Store: s})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- broker.Serve(ctx, ln, b, broker.ServeOptions{TLSCertFile: certFile, TLSKeyFile: keyFile})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	tok, _, err := broker.CreateToken(context.Background(), s, store.RoleRead, []string{"*"}, "")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	for _, grpc := range []bool{false, true} {
		c, err := client.Dial(url, client.Options{Token: tok, GRPC: grpc, TLSConfig: &tls.Config{RootCAs: pool}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{})); err != nil {
			t.Errorf("over TLS (grpc=%v): %v", grpc, err)
		}
	}
	// An untrusted certificate is refused by the client, which says why
	// and how to trust it.
	c, _ := client.Dial(url, client.Options{Token: tok})
	_, err = c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{}))
	if _, ok := api.UntrustedCert(err); !ok {
		t.Errorf("untrusted certificate: %v, want it recognised as one", err)
	}
	if msg := api.Describe(err); !strings.Contains(msg, "not trusted") || !strings.Contains(msg, api.FieldCA) {
		t.Errorf("untrusted certificate described as %q, want it to say it is not trusted and how to fix it", msg)
	}
	// Cleartext to the TLS port fails.
	c, _ = client.Dial("http://"+ln.Addr().String(), client.Options{Token: tok})
	if _, err := c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{})); err == nil {
		t.Error("cleartext call to a TLS broker succeeded")
	}
}
