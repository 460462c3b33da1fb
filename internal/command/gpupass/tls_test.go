package gpupass_test

import (
	"strings"
	"testing"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
)

// TestBrokerTLSTrust: against a broker with a self-signed certificate the
// CLI stops at the first call with a usage error that says the certificate
// is not trusted and how to trust it; with --tls-ca it works.
func TestBrokerTLSTrust(t *testing.T) {
	t.Parallel()
	b, certFile := brokertest.StartTLS(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	read := b.Token(t, store.RoleRead, "*")

	code, _, stderr := runMain(t, "nodes", "--broker-url", b.URL, "--broker-token", read)
	if code != 2 {
		t.Errorf("untrusted certificate: exit %d, want 2", code)
	}
	for _, want := range []string{"not trusted", "certificate signed by unknown authority", "--tls-ca", "system trust store"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q does not say %q", stderr, want)
		}
	}
	if strings.Contains(stderr, read) {
		t.Error("the token appears in the error")
	}

	code, stdout, stderr := runMain(t, "nodes", "--broker-url", b.URL, "--broker-token", read, "--tls-ca", certFile)
	if code != 0 || !strings.Contains(stdout, "no nodes in scope") {
		t.Errorf("with --tls-ca: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
