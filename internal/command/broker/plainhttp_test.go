package broker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestServeWarnsOffLoopbackWithoutTLS: `serve` says so when it listens
// where a network reaches it and has no TLS, since every token sent to it
// then crosses that network readable (issue #31); on loopback, or with
// TLS, it says nothing of the kind.
func TestServeWarnsOffLoopbackWithoutTLS(t *testing.T) {
	t.Parallel()
	cert, key, _ := brokertest.SelfSigned(t)
	tests := []struct {
		name string
		args []string
		warn bool
	}{
		{"every address, plain HTTP", []string{"--listen", "0.0.0.0:0"}, true},
		{"loopback, plain HTTP", []string{"--listen", "127.0.0.1:0"}, false},
		{"every address, TLS", []string{"--listen", "0.0.0.0:0", "--tls-cert", cert, "--tls-key", key}, false},
	}
	const warning = "listening off loopback without TLS"
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := filepath.Join(t.TempDir(), "broker.db")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out, errb testutil.Buffer
			done := make(chan int, 1)
			go func() {
				done <- Main(ctx, append([]string{"--db", "sqlite://" + db, "serve"}, tt.args...), &out, &errb)
			}()
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(errb.String(), "broker serving") {
				select {
				case code := <-done:
					t.Fatalf("serve exited %d before serving:\n%s", code, errb.String())
				case <-time.After(20 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("serve did not start:\n%s", errb.String())
				}
			}
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("exit %d after shutdown:\n%s", code, errb.String())
			}
			log := errb.String()
			if got := strings.Contains(log, warning); got != tt.warn {
				t.Errorf("warning %q in the log: %v, want %v:\n%s", warning, got, tt.warn, log)
			}
			if tt.warn && !strings.Contains(log, "--tls-cert and --tls-key") {
				t.Errorf("the warning does not say how to fix it:\n%s", log)
			}
		})
	}
}
