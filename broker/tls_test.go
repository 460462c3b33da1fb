package broker_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpupass-broker test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t)
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
		c, err := api.Dial(url, api.DialOptions{Token: tok, GRPC: grpc, TLSConfig: &tls.Config{RootCAs: pool}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{})); err != nil {
			t.Errorf("over TLS (grpc=%v): %v", grpc, err)
		}
	}
	// An untrusted certificate is refused by the client.
	c, _ := api.Dial(url, api.DialOptions{Token: tok})
	if _, err := c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{})); err == nil {
		t.Error("client accepted an untrusted certificate")
	}
	// Cleartext to the TLS port fails.
	c, _ = api.Dial("http://"+ln.Addr().String(), api.DialOptions{Token: tok})
	if _, err := c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{})); err == nil {
		t.Error("cleartext call to a TLS broker succeeded")
	}
}
